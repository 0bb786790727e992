"""One evaluation as ringtrain-eval runs it: prompt sets read and checked, models loaded,
every assistant turn decoded at each of the run's temperatures (in one process, or by
worker processes that take the conversations one at a time), and the report of what was
measured at each temperature.

Everything that can be refused without the models (prompts, the drafter's config, the
target's context) is checked before they load.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import AutoConfig, AutoTokenizer

from ringtrain.cpu_math import settle_cpu_math
from ringtrain.drafter import DrafterSpec
from ringtrain.eval.dflash import load_dflash_drafter, read_drafter_spec
from ringtrain.eval.metrics import EvalReport, PromptOutcome, summarize
from ringtrain.eval.processes import local_pull, run_workers
from ringtrain.eval.runner import (
    Task,
    TurnDecoder,
    TurnProgress,
    conversation_tasks,
    decode_tasks,
)
from ringtrain.eval.settings import SamplingSettings
from ringtrain.eval.stop import EvalStopped, stopped_by_signals
from ringtrain.eval.target import load_verifying_target
from ringtrain.eval.ties import TieJudge
from ringtrain.generate.chat import ChatRenderer
from ringtrain.generate.model import stop_token_ids
from ringtrain.generate.prompt_sets import PromptOptions, PromptSet, first_prompt, load_prompt_sets

Prepared = tuple[list[PromptSet], ChatRenderer, DrafterSpec]
# The divergence rule at a temperature, where outputs are not compared with greedy.
NOT_COMPARED = "none (sampled outputs are not compared token for token)"


def _tokenizer(target: Path):
    if (target / "tokenizer.json").is_file() or (target / "tokenizer_config.json").is_file():
        return AutoTokenizer.from_pretrained(target, local_files_only=True)
    return None


def _device(args: argparse.Namespace) -> torch.device:
    if args.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(args.device)


def _check_context(target_dir: Path, max_new_tokens: int) -> None:
    """Refuse answers longer than the target's context (before anything is allocated)."""
    config = AutoConfig.from_pretrained(target_dir, local_files_only=True).get_text_config()
    context = getattr(config, "max_position_embeddings", None)
    if context is not None and max_new_tokens >= context:
        raise ValueError(
            f"--max-new-tokens {max_new_tokens} does not fit the target's context of "
            f"{context} positions (max_position_embeddings in {target_dir / 'config.json'}) "
            "with a prompt before it; give fewer"
        )


def prepare(args: argparse.Namespace) -> Prepared:
    """(prompt sets, renderer, drafter spec); checked before any model loads."""
    spec = read_drafter_spec(args.drafter)
    target_dir = Path(args.target).expanduser()
    _check_context(target_dir, args.max_new_tokens)
    renderer = ChatRenderer(_tokenizer(target_dir), args.chat_template_kwargs, args.system)
    # The drafter's vocabulary is the target's (load_dflash_drafter refuses a drafter of
    # another target).
    options = PromptOptions(renderer, spec.vocab_size, args.raw_prompts, args.limit)
    return load_prompt_sets(args.prompts, args.benchmark, options), renderer, spec


def decoding_label(sampling: SamplingSettings | None) -> str:
    """A decoding's short name in the progress bar: T=0 (greedy), T=1, ..."""
    return f"T={0 if sampling is None else sampling.temperature:g}"


def decode_share(
    args: argparse.Namespace,
    share: tuple[int, int],
    pull: Callable[[tuple[int, list[PromptOutcome]] | None], Task | None],
    prepared: Prepared | None = None,
) -> str:
    """Load the models and decode the tasks ``pull`` hands out (worker k of n: ``share``)
    with one decoder per entry of ``args.samplings`` (greedy or a temperature), reporting
    each one's outcomes through it; returns the tie rule of greedy decoding.

    ``prepared``: what ``prepare`` returned, where this process already read it (a
    worker process reads the prompts itself)."""
    threads = args.threads or (
        max(1, len(os.sched_getaffinity(0)) // args.workers) if args.workers > 1 else 0
    )
    if threads:
        torch.set_num_threads(threads)
    settle_cpu_math()
    device = _device(args)
    sets, renderer, spec = prepared or prepare(args)
    first = first_prompt(sets[0].conversations[0], renderer)
    target = load_verifying_target(
        Path(args.target).expanduser(), list(spec.tap_layers), device, args.dtype, args.mode
    )
    # Later turns are longer; the drafter extends its positions when one needs more.
    drafter = load_dflash_drafter(
        args.drafter, target, max_positions=len(first) + args.max_new_tokens
    )
    judge = TieJudge(target.model, args.tie_ulps)
    stops = stop_token_ids(target.model.config)
    decoders = [
        TurnDecoder(target, drafter, judge, stops, args.max_new_tokens, sampling)
        for sampling in args.samplings
    ]
    if share[0] == 0:
        decodings = "; ".join(
            "greedy" if sampling is None else sampling.describe() for sampling in args.samplings
        )
        print(
            f"ringtrain-eval: {sum(s.turns for s in sets)} assistant turns in "
            f"{', '.join(s.name for s in sets)}; {decodings}; block size {spec.block_size}, "
            f"taps {list(spec.tap_layers)}, verification by {target.mode} on {device}"
            f"{f', {share[1]} processes' if share[1] > 1 else ''}",
            file=sys.stderr,
        )
    for decoder in decoders:
        decoder.warm_up(first)
    decode_tasks(sets, decoders, renderer, target.vocab_size, pull)
    return judge.describe()


def evaluate(args: argparse.Namespace) -> list[EvalReport]:
    """Run the evaluation described by the parsed arguments; its report at each of
    ``args.samplings`` (the models load once, and every temperature's turns are handed
    out together). Raises `EvalStopped` when SIGTERM or SIGINT arrives."""
    with stopped_by_signals():
        prepared = prepare(args)
        sets, _, spec = prepared
        tasks = conversation_tasks(sets, len(args.samplings))
        labels = [decoding_label(sampling) for sampling in args.samplings]
        with TurnProgress(sets, labels) as progress:
            try:
                tie_rule = _decode_all(args, prepared, tasks, progress)
            except EvalStopped as stop:
                stop.done = sum(map(len, progress.outcomes))
                stop.total = progress.turns
                raise
    return reports_of(sets, args.samplings, progress.outcomes, tie_rule, spec.block_size)


def reports_of(
    sets: list[PromptSet],
    samplings: list[SamplingSettings | None],
    outcomes: list[list[PromptOutcome]],
    tie_rule: str,
    block_size: int,
) -> list[EvalReport]:
    """The report at each decoding of ``samplings`` from its ``outcomes`` in the order they
    were decoded (workers finish conversations in any order): each one's turns in the
    order of the sets, their prompts and turns; ``tie_rule`` judges greedy decoding only."""
    set_order = {prompt_set.name: k for k, prompt_set in enumerate(sets)}
    groups = {prompt_set.name: prompt_set.groups for prompt_set in sets}
    reports = []
    for sampling, decoded in zip(samplings, outcomes, strict=True):
        ordered = sorted(decoded, key=lambda o: (set_order[o.benchmark], o.index, o.turn))
        rule = tie_rule if sampling is None else NOT_COMPARED
        reports.append(summarize(ordered, block_size, rule, sampling, groups))
    return reports


def _decode_all(
    args: argparse.Namespace, prepared: Prepared, tasks: list[Task], progress: TurnProgress
) -> str:
    """Every conversation decoded, in this process or by ``args.workers`` processes; the
    tie rule the decoding used."""
    if args.workers == 1:
        return decode_share(args, (0, 1), local_pull(tasks, progress.report), prepared)
    return run_workers(decode_share, args, args.workers, tasks, progress.report)[0]
