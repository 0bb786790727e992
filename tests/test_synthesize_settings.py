"""ringtrain-data synthesize's settings: each one that cannot work is refused by name before a
model is loaded, its bounds are accepted, and the settings kept beside the output are
those that decide how records are written (a rerun with another of them is refused; one
with more conversations, another device or batch size continues)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from ringtrain.data.errors import DatasetError
from ringtrain.data.synthesize import SynthesisOptions, check_options


@pytest.fixture
def options(tmp_path: Path) -> SynthesisOptions:
    """Settings that work, for a directory holding a config.json."""
    (tmp_path / "config.json").write_text("{}")
    return SynthesisOptions(target=tmp_path, output=tmp_path / "prompts.jsonl", num=4)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num": 0}, "--num must be at least 1, not 0"),
        ({"turns": 3}, "--turns must be 1 or 2, not 3"),
        ({"turns": 0}, "--turns must be 1 or 2, not 0"),
        ({"temperature": 0.0}, "--temperature must be above 0, not 0.0"),
        ({"top_p": 0.0}, "--top-p must be in (0, 1], not 0.0"),
        ({"top_p": 1.01}, "--top-p must be in (0, 1], not 1.01"),
        ({"max_tokens": 0}, "--max-tokens must be at least 1, not 0"),
        ({"answer_tokens": 0}, "--answer-tokens must be at least 1, not 0"),
        ({"min_words": 5, "max_words": 4}, "--min-words 5 must be at most --max-words 4"),
        ({"min_words": -1}, "--min-words -1 must be at most --max-words 400"),
        ({"batch_size": -1}, "--batch-size must be 0 (the device's default) or more, not -1"),
        (
            {"topics": ["poems"], "topic_hint": "write about it"},
            "--topic-hint must contain {topic}",
        ),
        ({"topics": ["poems", "  "]}, "an empty --system or --topic was given"),
        ({"systems": [""]}, "an empty --system or --topic was given"),
    ],
)
def test_a_setting_that_cannot_work_is_refused_by_name(
    options: SynthesisOptions, change: dict[str, Any], message: str
) -> None:
    with pytest.raises(DatasetError) as refusal:
        check_options(replace(options, **change))
    assert message in str(refusal.value)


def test_a_directory_without_a_config_is_refused_as_not_a_model(tmp_path: Path) -> None:
    options = SynthesisOptions(target=tmp_path, output=tmp_path / "prompts.jsonl", num=1)
    with pytest.raises(DatasetError, match=r"not a model directory \(no config\.json\)"):
        check_options(options)


@pytest.mark.parametrize(
    "change",
    [
        {"num": 1},
        {"turns": 2, "answer_tokens": 1},
        {"temperature": 0.01, "top_p": 1.0, "max_tokens": 1},
        {"min_words": 7, "max_words": 7},
        {"min_words": 0},
        {"batch_size": 0},
        {"topics": ["poems"], "topic_hint": "{topic}"},
    ],
)
def test_the_bounds_of_each_setting_are_accepted(
    options: SynthesisOptions, change: dict[str, Any]
) -> None:
    check_options(replace(options, **change))


def test_the_answer_length_is_kept_only_for_two_turns(options: SynthesisOptions) -> None:
    one_turn, two_turns = options, replace(options, turns=2)
    assert one_turn.settings() == replace(one_turn, answer_tokens=7).settings()
    assert two_turns.settings() != replace(two_turns, answer_tokens=7).settings()
    assert two_turns.settings()["answer_tokens"] == options.answer_tokens


def test_the_topic_hint_is_kept_only_with_topics(options: SynthesisOptions) -> None:
    steered = replace(options, topics=["poems"])
    assert options.settings() == replace(options, topic_hint="about {topic}").settings()
    assert steered.settings() != replace(steered, topic_hint="about {topic}").settings()


@pytest.mark.parametrize(
    "change",
    [
        {"seed": 1},
        {"temperature": 0.5},
        {"top_p": 0.9},
        {"max_tokens": 12},
        {"min_words": 4},
        {"max_words": 40},
        {"near_duplicate": 0.8},
        {"systems": ["be brief"]},
        {"turns": 2},
        {"chat_template_kwargs": {"enable_thinking": False}},
    ],
)
def test_each_setting_that_decides_the_records_is_kept(
    options: SynthesisOptions, change: dict[str, Any]
) -> None:
    assert replace(options, **change).settings() != options.settings()


@pytest.mark.parametrize(
    "change", [{"num": 40}, {"device": "cpu"}, {"dtype": "float32"}, {"batch_size": 8}]
)
def test_a_rerun_may_change_the_count_the_device_and_the_batch(
    options: SynthesisOptions, change: dict[str, Any]
) -> None:
    assert replace(options, **change).settings() == options.settings()
