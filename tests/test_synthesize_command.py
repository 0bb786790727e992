"""`ringtrain-data synthesize`'s command line, in-process: the options a run gets from its
arguments (the help's defaults when none are given, topics from files), the values the
parser refuses, and what the command says and returns when the run ends or is stopped (the
run itself is tested in test_synthesize)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from ringtrain.cli.data import main as data_main
from ringtrain.data import synthesize as synthesize_module
from ringtrain.data.synthesize import SynthesisOptions, SynthesisTotals, summary
from ringtrain.interrupts import Terminated

TOTALS = SynthesisTotals(asked=4, written=3, rounds=2, candidates=5, tokens=90, seconds=1.5)


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[SynthesisOptions, object]]:
    """The options and progress stream each run got (the run itself writes nothing)."""
    seen: list[tuple[SynthesisOptions, object]] = []

    def record(options: SynthesisOptions, progress: object = None) -> SynthesisTotals:
        seen.append((options, progress))
        return TOTALS

    monkeypatch.setattr(synthesize_module, "synthesize", record)
    return seen


def _required(tmp_path: Path) -> list[str]:
    return ["synthesize", "--target", str(tmp_path / "model"), "--output", "out.jsonl",
            "--num", "4"]  # fmt: skip


def test_without_options_a_run_gets_the_documented_defaults(
    tmp_path: Path, runs: list, capsys: pytest.CaptureFixture[str]
) -> None:
    assert data_main(_required(tmp_path)) == 0
    ((options, progress),) = runs
    assert options == SynthesisOptions(target=tmp_path / "model", output=Path("out.jsonl"), num=4)
    assert progress is sys.stderr
    assert capsys.readouterr().out == summary(options, TOTALS) + "\n"


def test_every_option_reaches_the_run(
    tmp_path: Path, runs: list, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    topics = tmp_path / "topics.txt"
    topics.write_text("  code review  \n\n   \nbaking\r\n", encoding="utf-8")
    argv = [
        "synthesize", "--target", "~/model", "--output", "out.jsonl", "--num", "9", "--resume",
        "--system", "Be brief.", "--system", "Be kind.", "--topic", "chess",
        "--topics", str(topics), "--topic-hint", "About {topic}.", "--turns", "2",
        "--temperature", "0.8", "--top-p", "0.9", "--seed", "7", "--max-tokens", "33",
        "--answer-tokens", "44", "--min-words", "5", "--max-words", "50",
        "--near-duplicate", "0.5", "--chat-template-kwargs", '{"enable_thinking": false}',
        "--device", "cpu", "--dtype", "float32", "--batch-size", "8", "--no-progress",
    ]  # fmt: skip
    assert data_main(argv) == 0
    ((options, progress),) = runs
    assert dataclasses.asdict(options) == {
        "target": tmp_path / "model", "output": Path("out.jsonl"), "num": 9,
        "systems": ["Be brief.", "Be kind."], "topics": ["chess", "code review", "baking"],
        "topic_hint": "About {topic}.", "turns": 2, "temperature": 0.8, "top_p": 0.9,
        "seed": 7, "max_tokens": 33, "answer_tokens": 44, "min_words": 5, "max_words": 50,
        "near_duplicate": 0.5, "chat_template_kwargs": {"enable_thinking": False},
        "device": "cpu", "dtype": "float32", "batch_size": 8, "resume": True,
    }  # fmt: skip
    assert progress is None


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--target", "t", "--output", "o"], "the following arguments are required: --num"),
        (["--output", "o", "--num", "1"], "the following arguments are required: --target"),
        (["--target", "t", "--output", "o", "--num", "1", "--turns", "3"],
         "--turns: invalid choice: 3"),
        (["--target", "t", "--output", "o", "--num", "1", "--device", "mps"],
         "--device: invalid choice: 'mps'"),
    ],
)  # fmt: skip
def test_the_parser_refuses_naming_the_option(
    arguments: list[str], message: str, runs: list, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as refusal:
        data_main(["synthesize", *arguments])
    assert refusal.value.code == 2
    assert message in capsys.readouterr().err
    assert runs == []


def test_a_topics_file_that_cannot_be_read_is_refused_in_one_line(
    tmp_path: Path, runs: list, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "missing.txt"
    assert data_main([*_required(tmp_path), "--topics", str(missing)]) == 2
    err = capsys.readouterr().err
    reason = "cannot read it (No such file or directory)"
    assert err == f"ringtrain-data: error: --topics {missing}: {reason}\n"
    assert runs == []


@pytest.mark.parametrize(
    ("stop", "status", "name"),
    [(KeyboardInterrupt(), 130, "Ctrl-C"), (Terminated(), 143, "SIGTERM")],
)
def test_a_stopped_run_says_its_output_is_kept_to_continue(
    stop: KeyboardInterrupt,
    status: int,
    name: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def stopped(options: SynthesisOptions, progress: object = None) -> SynthesisTotals:
        raise stop

    monkeypatch.setattr(synthesize_module, "synthesize", stopped)
    assert data_main(_required(tmp_path)) == status
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"ringtrain-data: stopped by {name}; the conversations written are kept in out.jsonl: "
        "rerun the same command to continue\n"
    )
