"""Rounds of synthesis with a tiny word-level chat model: the steering list is cycled
over rows and across rounds, and with two turns the follow-up is written after the
first user turn and the target's answer, every generated token counted; a turn cut at
the token limit is dropped."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from ringtrain.data.near_duplicates import NearDuplicateIndex
from ringtrain.data.synth_filters import CUT, FilterSettings
from ringtrain.data.synth_rounds import Synthesizer
from ringtrain.data.synth_steering import Steering, steerings
from ringtrain.data.synth_template import encode_prefix, user_turn_prefix
from ringtrain.data.synthesize import SynthesisOptions
from ringtrain.generate.local_model import LocalModel
from tests.helpers.word_chat_model import build_word_chat_model

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_word_chat_model(tmp_path_factory.mktemp("word-chat"))


class _Calls:
    """The prompts of every call a model answers, and the tokens each call generated."""

    def __init__(self, model: LocalModel, monkeypatch: pytest.MonkeyPatch) -> None:
        self.prompts: list[list[list[int]]] = []
        self.new_tokens: list[int] = []
        self.truncated: list[list[bool]] = []
        answer: Callable[..., Any] = model.answer

        def recorded(prompts: Sequence[Sequence[int]], *args: Any, **kwargs: Any) -> Any:
            self.prompts.append([list(p) for p in prompts])
            answers, stats = answer(prompts, *args, **kwargs)
            self.new_tokens.append(stats.new_tokens)
            self.truncated.append([a.truncated for a in answers])
            return answers, stats

        monkeypatch.setattr(model, "answer", recorded)


def _synthesizer(
    model_dir: Path,
    tmp_path: Path,
    rows: int,
    steering: list[Steering],
    turns: int = 1,
    max_tokens: int = 24,
) -> Synthesizer:
    options = SynthesisOptions(
        model_dir,
        tmp_path / "unused.jsonl",
        rows,
        turns=turns,
        max_tokens=max_tokens,
        answer_tokens=6,
    )
    model = LocalModel.load(model_dir, "cpu", batch_size=rows)
    return Synthesizer(
        model, options.round_settings(), steering, FilterSettings(), NearDuplicateIndex(0.7)
    )


def _prefix(synthesizer: Synthesizer, history: list[dict[str, str]]) -> list[int]:
    """The token ids the model writes a user turn after, following ``history``."""
    tokenizer, kwargs = synthesizer.tokenizer, synthesizer.settings.template_kwargs
    return encode_prefix(tokenizer, user_turn_prefix(tokenizer, history, kwargs))


def test_the_steering_list_is_cycled_across_rounds(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three system messages over rounds of two rows: each round starts where the last
    one ended, so every one steers as many rows."""
    steering = steerings(["sea", "rain", "code"], [])
    synthesizer = _synthesizer(model_dir, tmp_path, 2, steering)
    hint = synthesizer.settings.topic_hint
    by_prefix = {tuple(_prefix(synthesizer, s.writing_history(hint))): s.system for s in steering}
    assert len(by_prefix) == 3
    calls = _Calls(synthesizer.model, monkeypatch)
    kept = []
    for number in range(6):
        records = synthesizer.run(number, 2).records
        kept.append([record["messages"][0]["content"] for record in records])
    systems = [[by_prefix[tuple(prompt)] for prompt in prompts] for prompts in calls.prompts]
    assert systems == [["sea", "rain"], ["code", "sea"], ["rain", "code"]] * 2
    # Each conversation keeps the system message its first turn was written under.
    assert sum(map(len, kept)) >= 6
    for written, wrote_under in zip(kept, systems, strict=True):
        assert written in ([], wrote_under[:1], wrote_under[1:], wrote_under)


def test_a_follow_up_is_written_after_the_first_turn_and_the_answer(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    steering = steerings(["be brief"], [])
    synthesizer = _synthesizer(model_dir, tmp_path, 8, steering, turns=2)
    calls = _Calls(synthesizer.model, monkeypatch)
    reports: list[int] = []
    result = synthesizer.run(0, 8, reports.append)

    assert len(calls.prompts) == 3  # first turns, greedy answers, follow-ups
    assert result.records
    for record in result.records:
        system, first, answer, _ = record["messages"]
        assert system == {"role": "system", "content": "be brief"}
        assert _prefix(synthesizer, [system, first, answer]) in calls.prompts[2]
    assert result.tokens == sum(calls.new_tokens) == sum(reports)


def test_a_turn_cut_at_the_token_limit_is_dropped_as_cut(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Written turns that run to max_tokens are unfinished questions: none is kept, each is
    counted as cut."""
    synthesizer = _synthesizer(model_dir, tmp_path, 16, steerings(["ask"], []), max_tokens=4)
    calls = _Calls(synthesizer.model, monkeypatch)
    result = synthesizer.run(0, 16)
    (truncated,) = calls.truncated
    assert 0 < sum(truncated) < len(truncated), "the limit should cut some turns, not all"
    assert result.rejected[CUT] == sum(truncated)
    assert len(result.records) <= truncated.count(False)
