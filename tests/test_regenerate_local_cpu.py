"""ringtrain-data regenerate --local on a CPU, as a user meets it: memory limits that cut
or refuse a batch by name, progress per generated token, Ctrl-C once (the answers in
flight finish) and twice (abort), resume without duplicates, prompts past the model's
context, a missing GPU, failed first runs that leave nothing behind, and the model named
by its content. Tiny real chat models written with save_pretrained; the Ctrl-C tests
run the command as a real process and send it real signals."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from ringtrain.cli.data import main as data_main
from ringtrain.data.regen_client import Sampling
from ringtrain.data.regen_journal import errors_path, settings_path
from ringtrain.data.regen_local import LocalChat, LocalEngine
from ringtrain.data.regen_lock import lock_path
from ringtrain.generate.continuous import DoesNotFit, plan_slots
from ringtrain.generate.memory import DecodeFootprint
from tests.helpers.endless_chat_model import write_endless_chat_model
from tests.helpers.stops import reset_ctrl_c

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parents[1]
MAX_TOKENS = 12
# Long enough that a batch is still decoding when a test's Ctrl-C arrives.
LONG_ANSWER = 800
SHORT_CONTEXT = 48


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_endless_chat_model(tmp_path_factory.mktemp("endless"))


def _chats(path: Path, count: int, long_lines: tuple[int, ...] = ()) -> Path:
    """`count` one-question chats; the lines in `long_lines` (1-based) ask at length."""
    lines = []
    for number in range(1, count + 1):
        question = f"question number {number}" * (20 if number in long_lines else 1)
        lines.append(json.dumps({"messages": [{"role": "user", "content": question}]}))
    path.write_text("\n".join(lines) + "\n")
    return path


def _args(model: Path, chats: Path, output: Path, *extra: str) -> list[str]:
    return [
        "regenerate",
        *("--local", str(model), "--device", "cpu", "--threads", "1", "--input", str(chats)),
        *("--output", str(output), "--no-progress", *extra),
    ]


def _records(output: Path) -> list[dict]:
    return [json.loads(line) for line in output.read_text().splitlines()]


def _left_behind(output: Path) -> list[Path]:
    """The files of a run beside its output (and the output itself) that exist."""
    paths = [output, settings_path(output), lock_path(output), errors_path(output)]
    return [path for path in paths if path.exists()]


def test_a_batch_that_does_not_fit_the_memory_limit_is_cut_by_name(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    chats = _chats(tmp_path / "chats.jsonl", 6)
    config = AutoConfig.from_pretrained(model_dir)
    footprint = DecodeFootprint.of(config, torch.float32)
    limit = 8 << 20
    slots, _ = plan_slots(footprint, limit, 8, MAX_TOKENS)
    assert 1 <= slots < 8, "the limit should cut a batch of 8"
    whole, cut = tmp_path / "whole.jsonl", tmp_path / "cut.jsonl"
    assert data_main(_args(model_dir, chats, whole, "--max-tokens", str(MAX_TOKENS))) == 0
    capsys.readouterr()
    extra = ("--max-tokens", str(MAX_TOKENS), "--batch-size", "8", "--memory-limit", "8MiB")
    assert data_main(_args(model_dir, chats, cut, *extra)) == 0
    err = capsys.readouterr().err
    assert f"--batch-size 8 would need more: cut to {slots})" in err
    by_line = {r["regeneration"]["input_line"]: r["messages"] for r in _records(whole)}
    assert {r["regeneration"]["input_line"]: r["messages"] for r in _records(cut)} == by_line


def test_the_least_memory_that_fits_one_answer_plans_one_slot(model_dir: Path) -> None:
    """plan_slots at the smallest budget it accepts (found by bisection): one slot, not
    none; a byte less is refused."""
    footprint = DecodeFootprint.of(AutoConfig.from_pretrained(model_dir), torch.float32)

    def fits(budget: int) -> bool:
        try:
            plan_slots(footprint, budget, 8, MAX_TOKENS)
        except DoesNotFit:
            return False
        return True

    low, high = 0, 1 << 30
    assert fits(high) and not fits(low)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if fits(middle) else (middle, high)
    assert plan_slots(footprint, high, 8, MAX_TOKENS)[0] == 1
    assert plan_slots(footprint, 1 << 30, 8, MAX_TOKENS)[0] == 8


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--memory-limit", "64KiB"), "one answer of 12 tokens needs"),
        (("--max-tokens", str(10**9)), "is more than the model's context of 32768 tokens"),
    ],
)
def test_an_answer_that_cannot_fit_is_refused_by_name_before_anything_is_written(
    model_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    extra: tuple[str, ...],
    message: str,
) -> None:
    chats, output = _chats(tmp_path / "chats.jsonl", 2), tmp_path / "out.jsonl"
    assert data_main(_args(model_dir, chats, output, "--max-tokens", "12", *extra)) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert _left_behind(output) == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_device_cuda_without_cuda_is_refused_before_anything_is_written(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    chats, output = _chats(tmp_path / "chats.jsonl", 2), tmp_path / "out.jsonl"
    args = _args(model_dir, chats, output)
    args[args.index("cpu")] = "cuda"
    assert data_main(args) == 2
    err = capsys.readouterr().err
    assert "--device cuda:" in err and "sees no CUDA device" in err
    assert _left_behind(output) == []


@pytest.fixture(scope="module")
def short_context_dir(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The endless model with a context of SHORT_CONTEXT positions."""
    directory = tmp_path_factory.mktemp("short-context")
    shutil.copytree(model_dir, directory, dirs_exist_ok=True)
    config = json.loads((directory / "config.json").read_text())
    config["max_position_embeddings"] = SHORT_CONTEXT
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def test_a_prompt_past_the_context_is_listed_as_too_long(
    short_context_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    chats, output = _chats(tmp_path / "chats.jsonl", 3, long_lines=(2,)), tmp_path / "out.jsonl"
    assert data_main(_args(short_context_dir, chats, output, "--max-tokens", "8")) == 1
    records = _records(output)
    assert sorted(r["regeneration"]["input_line"] for r in records) == [1, 3]
    for record in records:
        (turn,) = record["regeneration"]["turns"]
        assert turn["prompt_tokens"] + turn["completion_tokens"] <= SHORT_CONTEXT
    (error,) = [json.loads(line) for line in errors_path(output).read_text().splitlines()]
    assert error["input_line"] == 2
    assert "too long" in error["error"] and f"context of {SHORT_CONTEXT} tokens" in error["error"]
    assert "Traceback" not in capsys.readouterr().err


def test_a_run_that_wrote_no_record_does_not_block_the_next(
    short_context_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    chats, output = _chats(tmp_path / "chats.jsonl", 2), tmp_path / "out.jsonl"
    # Every prompt is too long for 40 new tokens in a 48-token context: no record.
    assert data_main(_args(short_context_dir, chats, output, "--max-tokens", "40")) == 1
    assert _left_behind(output) == [errors_path(output)]  # the reasons are kept
    assert data_main(_args(short_context_dir, chats, output, "--max-tokens", "4")) == 0
    assert len(_records(output)) == 2
    assert "made with other settings" not in capsys.readouterr().err


def test_replaced_weights_are_detected_and_a_moved_model_resumes(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    chats, output = _chats(tmp_path / "chats.jsonl", 3), tmp_path / "out.jsonl"
    first = tmp_path / "first"
    shutil.copytree(model_dir, first)
    extra = ("--max-tokens", str(MAX_TOKENS))
    assert data_main(_args(first, chats, output, *extra)) == 0
    whole = output.read_text()
    output.write_text("".join(whole.splitlines(keepends=True)[:1]))
    moved = tmp_path / "elsewhere" / "model"
    moved.parent.mkdir()
    first.rename(moved)
    capsys.readouterr()
    assert data_main(_args(moved, chats, output, *extra)) == 0
    assert "(1 done before" in capsys.readouterr().out
    assert sorted(r["regeneration"]["input_line"] for r in _records(output)) == [1, 2, 3]
    model = AutoModelForCausalLM.from_pretrained(moved, dtype=torch.float32)
    with torch.no_grad():
        model.get_output_embeddings().weight[7] += 1.0
    model.save_pretrained(moved)
    assert data_main(_args(moved, chats, output, *extra)) == 2
    err = capsys.readouterr().err
    assert "made with other settings (model: 'local model, files sha256:" in err


@pytest.mark.parametrize("hybrid", [False, True], ids=["continuous", "batches"])
def test_progress_hears_every_token_as_it_is_generated(tmp_path: Path, hybrid: bool) -> None:
    model = write_endless_chat_model(tmp_path / "model", hybrid=hybrid)
    answer_tokens = 40
    sampling = Sampling(str(model), answer_tokens)
    heard: list[int] = []
    chat = LocalChat(
        LocalEngine(model, device="cpu", batch_size=2, threads=1), sampling, heard.append
    )
    questions = [[{"role": "user", "content": f"question {i}"}] for i in range(3)]

    async def ask_all() -> list[int]:
        await chat.open()
        try:
            completions = await asyncio.gather(*(chat.complete(q) for q in questions))
        finally:
            await chat.aclose()
        return [c.completion_tokens for c in completions]

    tokens = asyncio.run(ask_all())
    assert tokens == [answer_tokens] * 3
    assert sum(heard) == sum(tokens)
    # Reported every step (continuous) or every 16 steps (batches), not per answer.
    assert len(heard) >= (answer_tokens if not hybrid else 2 * answer_tokens // 16)


class _Console:
    """The stderr of a process, read as it comes (progress bars redraw with \\r)."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.text = ""
        self.ended = False  # the process closed its stderr: nothing more will come
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, args=(process.stderr,), daemon=True)
        self._reader.start()

    def _read(self, stream: object) -> None:
        while chunk := os.read(stream.fileno(), 4096):
            with self._changed:
                self.text += chunk.decode(errors="replace")
                self._changed.notify_all()
        with self._changed:
            self.ended = True
            self._changed.notify_all()

    def wait_for(self, needle: str, timeout: float = 300.0) -> None:
        """Until `needle` was printed; fails at once when the process ended without it."""
        with self._changed:
            self._changed.wait_for(lambda: needle in self.text or self.ended, timeout)
        assert needle in self.text, f"never printed {needle!r}; stderr so far:\n{self.text[-3000:]}"


def _start(args: list[str]) -> tuple[subprocess.Popen, _Console]:
    """The command as a process of its own, with Ctrl-C handled as in a terminal."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "ringtrain.cli.data", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=reset_ctrl_c,
    )
    return process, _Console(process)


@pytest.mark.parametrize(
    ("stop", "presses"),
    [(signal.SIGINT, 1), (signal.SIGINT, 2), (signal.SIGTERM, 1), (signal.SIGTERM, 2)],
)
def test_a_stop_finishes_the_answers_in_flight_a_second_ctrl_c_aborts(
    model_dir: Path, tmp_path: Path, stop: signal.Signals, presses: int
) -> None:
    """A SIGTERM (a scheduler, `timeout`) is taken as Ctrl-C, named as itself: the first
    finishes the answers in flight, a second aborts, and the exit code is the signal's."""
    chats, output = _chats(tmp_path / "chats.jsonl", 3), tmp_path / "out.jsonl"
    args = _args(model_dir, chats, output, "--max-tokens", str(LONG_ANSWER), "--batch-size", "2")
    args.remove("--no-progress")
    process, console = _start(args)
    try:
        console.wait_for(" tok at ")  # answers are being generated
        process.send_signal(stop)
        name = "SIGTERM" if stop == signal.SIGTERM else "Ctrl-C"
        console.wait_for(f"stopping ({name}): the answers in flight finish")
        if presses == 2:
            process.send_signal(stop)
        assert process.wait(300) == 128 + stop
    finally:
        process.kill()
    console.wait_for(f"stopped by {name}; the records written are kept")
    if presses == 1:  # the answers in flight were finished and written
        kept = output.read_text()
        written = _records(output)
        assert 1 <= len(written) <= 2
        assert {r["regeneration"]["turns"][0]["completion_tokens"] for r in written} == {
            LONG_ANSWER
        }
    else:  # aborted within the batch: no record, and nothing left that blocks a rerun
        kept = ""
        assert _left_behind(output) == []
    assert data_main([*args, "--no-progress"]) == 0
    assert output.read_text().startswith(kept)
    lines = [r["regeneration"]["input_line"] for r in _records(output)]
    assert sorted(lines) == [1, 2, 3]
