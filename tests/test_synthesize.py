"""ringtrain-data synthesize: a tiny word-level chat model (its own ChatML template) writes
user prompts from the template alone; filters, near-duplicate removal, two turns, the
refusal of a model without a template, and resuming after an interrupt or a kill."""

from __future__ import annotations

import itertools
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from ringtrain.cli.data import main as data_main
from ringtrain.data import synth_filters
from ringtrain.data.near_duplicates import NearDuplicateIndex, shingles
from ringtrain.data.regen_lock import lock_path
from ringtrain.data.regen_records import parse_record
from ringtrain.data.synth_filters import FilterSettings, rejection
from ringtrain.data.synth_rounds import Synthesizer
from ringtrain.data.synth_template import template_markers, user_turn_prefix
from ringtrain.generate.local_model import LocalModel
from tests.helpers.stops import stop_inside_a_finalizer
from tests.helpers.word_chat_model import build_word_chat_model

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[1]
THRESHOLD = 0.7


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_word_chat_model(tmp_path_factory.mktemp("word-chat"))


def _args(model: Path, output: Path, num: int, *extra: str) -> list[str]:
    return [
        "synthesize",
        *("--target", str(model), "--output", str(output), "--num", str(num)),
        *("--device", "cpu", "--batch-size", "16", "--max-tokens", "48", "--no-progress"),
        *extra,
    ]


def _records(output: Path) -> list[dict]:
    return [json.loads(line) for line in output.read_text().splitlines()]


def _first_turns(records: list[dict]) -> list[str]:
    return [next(m["content"] for m in r["messages"] if m["role"] == "user") for r in records]


def _jaccard(a: str, b: str) -> float:
    first, second = shingles(a), shingles(b)
    return len(first & second) / len(first | second)


def _assert_no_near_duplicates(texts: list[str]) -> None:
    for a, b in itertools.combinations(texts, 2):
        assert _jaccard(a, b) < THRESHOLD, (a, b)


def test_writes_n_distinct_prompts_that_regenerate_reads(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    output = tmp_path / "prompts.jsonl"
    assert data_main(_args(model_dir, output, 12)) == 0
    records = _records(output)
    assert len(records) == 12
    assert all([m["role"] for m in r["messages"]] == ["user"] for r in records)
    turns = _first_turns(records)
    assert len(set(turns)) == 12
    assert all(len(turn.split()) >= 3 for turn in turns)
    _assert_no_near_duplicates(turns)
    for number, line in enumerate(output.read_bytes().splitlines(), start=1):
        assert parse_record(line, number, str(output)).messages[-1]["role"] == "user"
    assert f"{output}: 12 conversations written" in capsys.readouterr().out


def test_near_duplicates_the_model_writes_are_removed(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A model that writes "write" most of the time repeats itself: its near duplicates are
    counted as dropped and none reaches the output, nor does one of a turn that an earlier
    run wrote."""
    model = build_word_chat_model(tmp_path / "skewed", skew=3.0)
    output = tmp_path / "prompts.jsonl"
    for num in (10, 20):
        assert data_main(_args(model, output, num)) == 0
        summary = capsys.readouterr().out
        dropped = int(summary.split("near duplicate ")[1].split()[0].rstrip(","))
        assert dropped > 0
        turns = _first_turns(_records(output))
        assert len(turns) == num
        _assert_no_near_duplicates(turns)


def test_the_lock_a_killed_client_left_is_taken_over_and_said(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    output = tmp_path / "prompts.jsonl"
    lock_path(output).write_text('{"pid": 4242, "host": "gpu-7"}\n')  # held by no process
    assert data_main(_args(model_dir, output, 3)) == 0
    assert (
        "took over the lock of pid 4242 on host gpu-7, which is no longer running"
        in capsys.readouterr().err
    )
    assert len(_records(output)) == 3


def test_planted_near_duplicates_are_removed() -> None:
    base = "write a short poem about the sea and the rain falling on the old harbour"
    planted = [
        base,
        "how do trains run on a ring of rails around the city",
        base.upper() + "!",  # the same words, other case and punctuation
        base.replace("harbour", "harbor"),  # the last word of fifteen changed: J = 12/14
        "explain how a python function sorts a list of numbers in place",
        "How do trains run on a ring of rails around the city?",
        "write a long story about the desert and the wind at night",
    ]
    index = NearDuplicateIndex(THRESHOLD)
    assert index.keep(planted) == [True, True, False, False, True, False, True]
    assert index.keep([base + " tonight", "give me three facts about the moon"]) == [False, True]
    assert len(index) == 5


def test_filters_drop_each_kind_of_bad_turn_with_its_reason() -> None:
    settings = FilterSettings(min_words=3, max_words=12, markers=("<|im_start|>assistant",))
    good = "Write a haiku about autumn leaves."
    cases = {
        "   ": synth_filters.EMPTY,
        "Write a haiku about": synth_filters.CUT,
        "Write haiku<|im_start|>assistant\nSure": synth_filters.LEAK,
        "Thanks!": synth_filters.TOO_SHORT,
        " ".join(["word"] * 13): synth_filters.TOO_LONG,
        "I'm sorry, but I cannot help with that.": synth_filters.REFUSAL,
        "Hello! How can I assist you today?": synth_filters.REFUSAL,
        "### ??? !!! ### ((( ))) a b c": synth_filters.NOT_TEXT,
        "broken \ufffd bytes in this text": synth_filters.NOT_TEXT,
    }
    for text, reason in cases.items():
        truncated = reason == synth_filters.CUT
        assert rejection(text, truncated, False, settings) == reason, text
    assert rejection(good, False, True, settings) == synth_filters.LEAK  # a special token id
    assert rejection(good, False, False, settings) is None
    repeated = FilterSettings(min_words=3, max_words=100)
    assert rejection("go " * 20, False, False, repeated) == synth_filters.NOT_TEXT


def test_word_limits_are_inclusive() -> None:
    """A turn of exactly min_words or max_words words is kept; one word past is dropped."""
    settings = FilterSettings(min_words=3, max_words=6)
    assert rejection("write a haiku", False, False, settings) is None
    assert rejection("write a haiku about autumn leaves", False, False, settings) is None
    too_long = "write a haiku about the autumn leaves"
    assert rejection(too_long, False, False, settings) == synth_filters.TOO_LONG


def test_control_characters_and_a_word_repeated_are_not_text() -> None:
    """Control characters other than line breaks and tabs make a turn not text, and so do
    twelve words (the least counted) that are one word repeated."""
    settings = FilterSettings(min_words=3, max_words=100)
    for text in ("Write a haiku\x1b[31m about leaves", "Write a haiku\x00 about leaves"):
        assert rejection(text, False, False, settings) == synth_filters.NOT_TEXT, text
    assert rejection("Write a haiku\r\nabout autumn\tleaves.", False, False, settings) is None
    assert rejection("go " * 12, False, False, settings) == synth_filters.NOT_TEXT


def test_texts_differing_in_their_last_or_only_words_are_not_near_duplicates() -> None:
    """Every run of three words counts, the last one too, and a text of fewer words is one
    shingle of its own: such texts differ."""
    assert shingles("write a poem about cats") == {
        b"write a poem",
        b"a poem about",
        b"poem about cats",
    }
    assert shingles("hello there") == {b"hello there"}
    index = NearDuplicateIndex(THRESHOLD)
    texts = ["write a poem about cats", "write a poem about dogs", "hello there", "good night"]
    assert index.keep(texts) == [True, True, True, True]


def test_a_text_is_dropped_only_at_the_threshold_of_a_kept_one() -> None:
    """The LSH index proposes candidates whose signatures share a band, some of them below
    the threshold; only a candidate whose estimated similarity reaches it drops the text.
    Checked against every kept text, on 300 texts sharing prefixes of one text's words
    (estimated similarities around the threshold)."""
    from datasketch import MinHash

    rng = random.Random(0)
    vocabulary = [f"word{i}" for i in range(500)]
    base = rng.choices(vocabulary, k=30)
    texts = [" ".join(base)] + [
        " ".join(base[: rng.randint(8, 18)] + rng.choices(vocabulary, k=14)) for _ in range(300)
    ]
    threshold = 0.3
    index = NearDuplicateIndex(threshold)
    flags = index.keep(texts)
    signatures = MinHash.bulk(
        [shingles(t) for t in texts], num_perm=index.num_perm, seed=index.seed
    )
    kept = []
    for text, signature, flag in zip(texts, signatures, flags, strict=True):
        nearest = max((signature.jaccard(other) for other in kept), default=0.0)
        if flag:
            kept.append(signature)
        else:
            assert nearest >= threshold, (text, nearest)
    assert 0 < flags.count(False) < len(texts) - 1


def test_thresholds_up_to_one_are_accepted_and_exact_copies_still_removed() -> None:
    """At the strictest thresholds only copies (same words, any case and punctuation)
    are removed."""
    text = "explain how a python function sorts a list of numbers in place"
    for threshold in (0.99, 1.0):
        index = NearDuplicateIndex(threshold)
        assert index.keep([text, text.upper() + "!", text + " quickly"]) == [True, False, True]


def test_prefix_and_markers_come_from_the_template(model_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    system = [{"role": "system", "content": "be brief"}]
    assert user_turn_prefix(tokenizer, []) == "<|im_start|>user\n"
    assert user_turn_prefix(tokenizer, system) == (
        "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\n"
    )
    markers = template_markers(tokenizer)
    assert "<|im_start|>assistant" in markers
    assert "<|im_end|>" in markers


def test_a_model_without_chat_template_is_refused_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    model = build_word_chat_model(tmp_path / "base", with_template=False)
    output = tmp_path / "prompts.jsonl"
    capsys.readouterr()  # what writing the model printed
    assert data_main(_args(model, output, 4)) == 2
    error = capsys.readouterr().err.strip()
    assert error.count("\n") == 0
    assert f"--target {model}: the model has no chat template" in error
    assert not output.exists()


def test_two_turns_answer_greedily_and_write_a_follow_up(model_dir: Path, tmp_path: Path) -> None:
    output = tmp_path / "two.jsonl"
    steering = ("--system", "be brief", "--topic", "poems", "--topic", "code")
    assert (
        data_main(_args(model_dir, output, 4, "--turns", "2", "--answer-tokens", "5", *steering))
        == 0
    )
    records = _records(output)
    assert len(records) == 4
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    for record in records:
        messages = record["messages"]
        assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
        assert messages[0]["content"] == "be brief"  # the topic hint is not written
        assert record["synthesis"]["topic"] in ("poems", "code")
        prompt = tokenizer.apply_chat_template(
            messages[:2], add_generation_prompt=True, return_dict=False
        )
        greedy = model.generate(torch.tensor([prompt]), max_new_tokens=5, do_sample=False)
        answer = tokenizer.decode(greedy[0, len(prompt) :], skip_special_tokens=True)
        assert messages[2]["content"] == answer
        assert len(messages[3]["content"].split()) >= 3
    assert {r["synthesis"]["topic"] for r in records} == {"poems", "code"}


def test_rerun_continues_without_duplicates_and_refuses_other_settings(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    output = tmp_path / "prompts.jsonl"
    assert data_main(_args(model_dir, output, 8)) == 0
    first = _records(output)
    with output.open("a") as file:
        file.write('{"messages": [{"role": "user", "content": "torn')  # a crash mid-write
    assert data_main(_args(model_dir, output, 20)) == 0
    assert "dropped the torn last line" in capsys.readouterr().err
    records = _records(output)
    assert records[:8] == first
    assert len(records) == 20
    last_round = max(r["synthesis"]["round"] for r in first)
    assert all(r["synthesis"]["round"] > last_round for r in records[8:])
    _assert_no_near_duplicates(_first_turns(records))
    assert data_main(_args(model_dir, output, 30, "--temperature", "0.5")) == 2
    error = capsys.readouterr().err
    assert "made with other settings (temperature: 1.0 -> 0.5)" in error
    assert len(_records(output)) == 20


def _count_lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def _synthesizing(model_dir: Path, output: Path, stderr: int) -> subprocess.Popen:
    """A synthesize process writing (far more than it will) into ``output``, once it has
    written 6 lines; ``stderr`` as subprocess.Popen takes it (text when a pipe)."""
    command = [sys.executable, "-m", "ringtrain.cli.data", *_args(model_dir, output, 100_000)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(command, cwd=ROOT, env=env, stderr=stderr, text=True)
    deadline = time.monotonic() + 300
    try:
        while _count_lines(output) < 6:
            assert process.poll() is None, "the synthesize process ended early"
            assert time.monotonic() < deadline, "no records written in time"
            time.sleep(0.05)
    except BaseException:
        process.kill()
        raise
    return process


@pytest.mark.slow
def test_a_killed_run_is_continued_by_the_next(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A real process is killed (SIGKILL) while it writes; while it runs a second client
    is refused; the rerun takes over its lock and writes the rest without duplicates."""
    output = tmp_path / "prompts.jsonl"
    process = _synthesizing(model_dir, output, stderr=subprocess.DEVNULL)
    try:
        assert data_main(_args(model_dir, output, 100_000)) == 2
        assert "another synthesize client is writing it" in capsys.readouterr().err
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    complete = _count_lines(output)  # a torn last line, if any, is cut by the rerun
    assert data_main(_args(model_dir, output, complete + 6)) == 0
    assert "took over the lock of pid" in capsys.readouterr().err
    records = _records(output)
    assert len(records) == complete + 6
    _assert_no_near_duplicates(_first_turns(records))


def test_sigterm_stops_with_one_line_and_the_rerun_continues(
    model_dir: Path, tmp_path: Path
) -> None:
    """SIGTERM (a scheduler, `timeout`) is taken as a Ctrl-C: the conversations written are
    kept, one line names the signal, the exit status is 143, and a rerun continues."""
    output = tmp_path / "prompts.jsonl"
    process = _synthesizing(model_dir, output, stderr=subprocess.PIPE)
    try:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 128 + signal.SIGTERM
    assert err.strip().splitlines()[-1] == (
        f"ringtrain-data: stopped by SIGTERM; the conversations written are kept in {output}: "
        "rerun the same command to continue"
    )
    assert "Traceback" not in err
    complete = _count_lines(output)
    assert data_main(_args(model_dir, output, complete + 4)) == 0
    assert len(_records(output)) == complete + 4


def test_a_stop_python_dropped_in_a_finalizer_ends_the_run_after_its_round(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """A SIGTERM whose exception a finalizer swallowed during a round (Python reports it
    and goes on) stops the run before the next round: the round's conversations are
    kept, the stop is named, exit status 143."""
    monkeypatch.setattr(sys, "unraisablehook", lambda _report: None)
    one_round = Synthesizer.run
    rounds = []

    def round_dropping_a_stop(self, *args, **kwargs):
        rounds.append(len(rounds))
        result = one_round(self, *args, **kwargs)
        stop_inside_a_finalizer()
        return result

    monkeypatch.setattr(Synthesizer, "run", round_dropping_a_stop)
    output = tmp_path / "prompts.jsonl"
    assert data_main(_args(model_dir, output, 200)) == 128 + signal.SIGTERM
    assert rounds == [0]
    assert 0 < len(_records(output)) < 200
    assert "stopped by SIGTERM" in capsys.readouterr().err


def test_a_template_refusing_a_steering_is_named_before_the_output_is_touched(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A template that rejects the system role (as some do) is refused with --system at the
    start, by its words, before a lock or a settings file is written beside the output."""
    model = tmp_path / "no-system"
    shutil.copytree(model_dir, model)
    tokenizer = AutoTokenizer.from_pretrained(model)
    tokenizer.chat_template = (
        "{%- if messages[0]['role'] == 'system' %}"
        "{{ raise_exception('System role not supported') }}{%- endif %}" + tokenizer.chat_template
    )
    tokenizer.save_pretrained(model)
    output = tmp_path / "out" / "prompts.jsonl"
    output.parent.mkdir()
    assert data_main(_args(model, output, 4, "--system", "be brief")) == 2
    error = capsys.readouterr().err
    assert "the chat template refused a system/user conversation (System role not supported)" in (
        error
    )
    assert list(output.parent.iterdir()) == []
    assert data_main(_args(model, output, 4)) == 0  # without it, the template works
    assert len(_records(output)) == 4


def test_rounds_that_keep_nothing_end_the_run_after_eight_in_a_row(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """Seven barren rounds, one that keeps a conversation, then barren rounds: the run gives
    up after the eighth barren round in a row (round 16), naming what was dropped."""
    one_round = Synthesizer.run
    kept_at = {8}
    calls = []

    def scripted_round(self, number, *args, **kwargs):
        calls.append(number)
        assert len(calls) <= 16, "the run went on past eight barren rounds in a row"
        result = one_round(self, number, *args, **kwargs)
        if len(calls) in kept_at:
            assert result.records, "the real round kept nothing"
            return replace(result, records=result.records[:1])
        return replace(result, records=[], rejected=Counter({"too short": result.candidates}))

    monkeypatch.setattr(Synthesizer, "run", scripted_round)
    output = tmp_path / "prompts.jsonl"
    assert data_main(_args(model_dir, output, 50)) == 2
    assert calls == list(range(16))
    error = capsys.readouterr().err
    assert re.search(r"8 rounds in a row kept no conversation \(dropped: [^)]*too short \d+", error)
    assert "check that --target is a chat (instruct) model" in error
    assert len(_records(output)) == 1


def test_a_finished_output_is_left_as_it_is_without_loading_the_model(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    output = tmp_path / "prompts.jsonl"
    assert data_main(_args(model_dir, output, 5)) == 0
    written = output.read_bytes()
    capsys.readouterr()

    def no_load(*_args, **_kwargs):
        raise AssertionError("the model was loaded for an output already written")

    monkeypatch.setattr(LocalModel, "load", no_load)
    for num in (5, 3):
        assert data_main(_args(model_dir, output, num)) == 0
        assert f"{output}: 0 conversations written" in capsys.readouterr().out
    assert output.read_bytes() == written
