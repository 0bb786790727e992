"""Synthesize user prompts with the target alone: its chat template's user turn, continued.

An aligned chat model given only its template's text up to a user turn's content writes
a plausible user request (the Magpie method: Xu et al., 2024, "Magpie: Alignment Data
Synthesis from Scratch by Prompting Aligned LLMs with Nothing"): the distribution of
requests the model itself expects, which is the traffic its drafter must follow. This
runs that in rounds of one large batch (``synth_rounds``): sampled at a temperature,
steered by system messages and topics, filtered (``synth_filters``), near duplicates
removed (``near_duplicates``), optionally followed by the target's greedy answer and a
second written user turn. The output is chat JSONL (``{"messages": [...]}``, user turns
last) that ``ringtrain-data regenerate`` answers.

The output is resumable like regenerate's: records are appended whole as rounds finish
(``synth_output``), one client writes an output at a time (``regen_lock``), the
settings that decide the records are kept beside it and a rerun with others is refused
(``regen_journal.check_settings``). A rerun continues after the rounds written and
never writes a prompt near one already written; a larger ``num`` extends the file.
"""

from __future__ import annotations

import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from tqdm import tqdm

from ringtrain.data.errors import DatasetError
from ringtrain.data.near_duplicates import NearDuplicateIndex
from ringtrain.data.regen_journal import check_settings
from ringtrain.data.regen_lock import OutputLock
from ringtrain.data.synth_filters import FilterSettings, count_line
from ringtrain.data.synth_output import SynthesisOutput
from ringtrain.data.synth_rounds import RoundSettings, Synthesizer
from ringtrain.data.synth_steering import DEFAULT_TOPIC_HINT, steerings
from ringtrain.data.synth_template import require_chat_template, template_markers
from ringtrain.interrupts import raise_taken_stop

# Rounds in a row that keep nothing before the run gives up.
STALL_ROUNDS = 8


@dataclass
class SynthesisOptions:
    """What `synthesize` writes, with which model, and how."""

    target: Path
    output: Path
    num: int
    systems: list[str] = field(default_factory=list)
    topics: list[str] = field(default_factory=list)
    topic_hint: str = DEFAULT_TOPIC_HINT
    turns: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0
    max_tokens: int = 256
    answer_tokens: int = 512
    min_words: int = 3
    max_words: int = 400
    near_duplicate: float = 0.7
    chat_template_kwargs: dict[str, Any] | None = None
    device: str = "auto"
    dtype: str = "auto"
    batch_size: int = 0  # 0: the device's default
    resume: bool = False

    def settings(self) -> dict[str, Any]:
        """The settings that decide the records (kept beside the output)."""
        return {
            "target": str(self.target.resolve()),
            "systems": self.systems,
            "topics": self.topics,
            "topic_hint": self.topic_hint if self.topics else None,
            "turns": self.turns,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "seed": self.seed,
            "max_tokens": self.max_tokens,
            "answer_tokens": self.answer_tokens if self.turns == 2 else None,
            "min_words": self.min_words,
            "max_words": self.max_words,
            "near_duplicate": self.near_duplicate,
            "chat_template_kwargs": self.chat_template_kwargs,
        }

    def round_settings(self) -> RoundSettings:
        """How each round samples."""
        return RoundSettings(
            turns=self.turns,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=self.seed,
            max_tokens=self.max_tokens,
            answer_tokens=self.answer_tokens,
            topic_hint=self.topic_hint,
            template_kwargs=dict(self.chat_template_kwargs or {}),
        )


@dataclass
class SynthesisTotals:
    """What a run did."""

    asked: int = 0
    done_before: int = 0
    written: int = 0
    rounds: int = 0
    candidates: int = 0  # first user turns written by the model
    tokens: int = 0  # generated tokens, answers included
    rejected: Counter = field(default_factory=Counter)
    seconds: float = 0.0


def check_options(options: SynthesisOptions) -> None:
    """Refuse settings that cannot work before anything is loaded; raises DatasetError."""
    checks = [
        (options.num >= 1, f"--num must be at least 1, not {options.num}"),
        (options.turns in (1, 2), f"--turns must be 1 or 2, not {options.turns}"),
        (options.temperature > 0, f"--temperature must be above 0, not {options.temperature}"),
        (0 < options.top_p <= 1, f"--top-p must be in (0, 1], not {options.top_p}"),
        (options.max_tokens >= 1, f"--max-tokens must be at least 1, not {options.max_tokens}"),
        (
            options.answer_tokens >= 1,
            f"--answer-tokens must be at least 1, not {options.answer_tokens}",
        ),
        (
            0 <= options.min_words <= options.max_words,
            f"--min-words {options.min_words} must be at most --max-words {options.max_words}",
        ),
        (
            options.batch_size >= 0,
            f"--batch-size must be 0 (the device's default) or more, not {options.batch_size}",
        ),
        (
            "{topic}" in options.topic_hint,
            f"--topic-hint must contain {{topic}}, where each topic goes: {options.topic_hint!r}",
        ),
    ]
    for ok, message in checks:
        if not ok:
            raise DatasetError(message)
    if any(not text.strip() for text in options.systems + options.topics):
        raise DatasetError("an empty --system or --topic was given; give text, or leave it out")
    if not (options.target / "config.json").is_file():
        raise DatasetError(
            f"--target {options.target}: not a model directory (no config.json); pass the "
            "local Hugging Face directory of the chat model"
        )


def _filters(tokenizer: Any, options: SynthesisOptions) -> FilterSettings:
    """The filters, with the template's markers; renders every steering's prefix once, so
    a template that refuses them fails here, before the output is touched."""
    from ringtrain.data.synth_template import user_turn_prefix

    kwargs = dict(options.chat_template_kwargs or {})
    for steer in steerings(options.systems, options.topics):
        user_turn_prefix(tokenizer, steer.writing_history(options.topic_hint), kwargs)
    markers = tuple(template_markers(tokenizer, kwargs))
    return FilterSettings(options.min_words, options.max_words, markers)


def synthesize(options: SynthesisOptions, progress: TextIO | None = None) -> SynthesisTotals:
    """Write ``options.num`` conversations into ``options.output`` (continuing it); returns
    the totals, with a progress bar on ``progress`` (None: none). Raises DatasetError for
    unusable settings, files or models."""
    check_options(options)
    from ringtrain.generate.local_model import load_tokenizer  # transformers: only when run

    tokenizer = load_tokenizer(options.target)
    require_chat_template(tokenizer, str(options.target))
    filters = _filters(tokenizer, options)
    index = NearDuplicateIndex(options.near_duplicate)
    with OutputLock(options.output, "synthesize") as lock:
        check_settings(options.output, options.settings(), options.resume)
        output = SynthesisOutput(options.output)
        try:
            return _run(options, output, filters, index, lock, progress)
        finally:
            output.close()


def _note(message: str) -> None:
    """A line on stderr that leaves the progress bar intact."""
    tqdm.write(f"ringtrain-data: {message}", file=sys.stderr)


def _run(
    options: SynthesisOptions,
    output: SynthesisOutput,
    filters: FilterSettings,
    index: NearDuplicateIndex,
    lock: OutputLock,
    progress: TextIO | None,
) -> SynthesisTotals:
    """`synthesize` once the output is locked and open."""
    totals = SynthesisTotals(asked=options.num, done_before=len(output.records))
    started = time.monotonic()
    index.keep([record.first_user_turn for record in output.records])
    bar = tqdm(
        total=options.num,
        initial=min(totals.done_before, options.num),
        desc="synthesize",
        unit="conv",
        file=progress,
        disable=progress is None,
        dynamic_ncols=True,
    )
    if lock.taken_over:
        _note(f"took over the lock of {lock.taken_over}, which is no longer running")
    if output.cut_bytes:
        _note(f"dropped the torn last line of {output.path} ({output.cut_bytes} bytes)")
    try:
        if totals.done_before < options.num:
            synthesizer = _synthesizer(options, filters, index)
            # Created once the model is loaded, so that its rate is generation's alone.
            with _token_bar(progress) as tokens:
                _rounds(synthesizer, output, options, totals, bar, tokens)
    finally:
        bar.close()
        totals.seconds = time.monotonic() - started
    return totals


def _synthesizer(
    options: SynthesisOptions, filters: FilterSettings, index: NearDuplicateIndex
) -> Synthesizer:
    """The target loaded, ready to write rounds."""
    from ringtrain.generate.local_model import LocalModel
    from ringtrain.generate.model import IncompleteModelError

    try:
        model = LocalModel.load(options.target, options.device, options.dtype, options.batch_size)
    except IncompleteModelError as exc:
        raise DatasetError(f"--target {exc}") from None
    return Synthesizer(
        model, options.round_settings(), steerings(options.systems, options.topics), filters, index
    )


def _token_bar(progress: TextIO | None) -> tqdm:
    """The second bar: tokens generated and their rate, advancing while a round decodes
    (a round of many long turns takes minutes on a CPU)."""
    return tqdm(
        desc="generate",
        unit="tok",
        file=progress,
        disable=progress is None,
        dynamic_ncols=True,
        position=1,
    )


def _rounds(
    synthesizer: Synthesizer,
    output: SynthesisOutput,
    options: SynthesisOptions,
    totals: SynthesisTotals,
    bar: tqdm,
    tokens: tqdm,
) -> None:
    """Run rounds until ``options.num`` conversations are written; ``bar`` counts them,
    ``tokens`` the tokens generated."""
    number = output.next_round
    barren = 0
    while totals.done_before + totals.written < options.num:
        raise_taken_stop()
        result = synthesizer.run(number, synthesizer.model.batch_size, tokens.update)
        totals.rounds += 1
        totals.candidates += result.candidates
        totals.tokens += result.tokens
        totals.rejected.update(result.rejected)
        wanted = options.num - totals.done_before - totals.written
        for record in result.records[:wanted]:
            output.write(record)
        totals.written += min(wanted, len(result.records))
        bar.update(min(wanted, len(result.records)))
        kept = (totals.written / totals.candidates) if totals.candidates else 0.0
        bar.set_postfix_str(f"{kept:.0%} kept", refresh=False)
        barren = 0 if result.records else barren + 1
        if barren >= STALL_ROUNDS:
            raise DatasetError(
                f"{barren} rounds in a row kept no conversation (dropped: "
                f"{count_line(totals.rejected)}); check that --target is a chat (instruct) "
                "model, or loosen the filters (--min-words, --max-words, --max-tokens)"
            )
        number += 1


def summary(options: SynthesisOptions, totals: SynthesisTotals) -> str:
    """One line on what a finished run did."""
    rate = totals.tokens / totals.seconds if totals.seconds > 0 else 0.0
    line = (
        f"{options.output}: {totals.written} conversations written in {totals.seconds:.1f} s "
        f"({totals.done_before} before, {totals.asked} asked for), {totals.rounds} rounds, "
        f"{totals.candidates} first turns written, {totals.tokens} tokens ({rate:.0f} tokens/s)"
    )
    if totals.rejected:
        line += f"; dropped: {count_line(totals.rejected)}"
    return line
