"""`ringtrain-data prepare` fails fast and cleanly: bad tokenizer directories, worker errors,
a killed worker, and oversized records (memory stays bounded)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from ringtrain.cli.data import main as data_main
from ringtrain.data.errors import DatasetError
from ringtrain.data.prepare import _next_result, prepare_dataset
from ringtrain.interrupts import Terminated, sigterm_taken_as_ctrl_c
from tests.helpers.chat_data import CONVERSATIONS
from tests.helpers.stops import (
    output_or_stacks,
    send_stop,
    start_in_session,
    stop_inside_a_finalizer,
    stop_name,
)

FAILURE_TIMEOUT_S = 120
JOIN_S = 30
POLL_S = 0.01


def test_wrong_tokenizer_directory_fails_once_before_workers(
    tmp_path: Path,
    chats: Path,
    capsys: pytest.CaptureFixture,
) -> None:
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    args = ["prepare", "--tokenizer", str(empty), "--input", str(chats)]
    assert data_main([*args, "--output", str(tmp_path / "out"), "--workers", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("no tokenizer here (none of tokenizer.json, tokenizer_config.json)") == 1
    assert not (tmp_path / "out").exists()


def test_tokenizer_without_chat_template_is_named(
    tmp_path: Path,
    chats: Path,
    tokenizer_dir: Path,
) -> None:
    plain = tmp_path / "plain"
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    tokenizer.chat_template = None
    tokenizer.save_pretrained(plain)
    (plain / "chat_template.jinja").unlink(missing_ok=True)
    with pytest.raises(DatasetError, match="no chat template"):
        prepare_dataset(plain, chats, tmp_path / "out", workers=2, progress=None)


def test_worker_error_stops_the_command_with_its_message(
    tmp_path: Path,
    tokenizer_dir: Path,
) -> None:
    path = tmp_path / "chats.jsonl"
    good = json.dumps(CONVERSATIONS[0])
    path.write_text("\n".join([good] * 2 + ["{not json"] + [good] * 600) + "\n")
    with pytest.raises(DatasetError, match=r"chats\.jsonl:3: not valid JSON"):
        prepare_dataset(tokenizer_dir, path, tmp_path / "out", workers=2, progress=None)
    assert not any((tmp_path / "out").iterdir())


def test_oversized_records_are_rejected_unread(
    tmp_path: Path,
    tokenizer_dir: Path,
) -> None:
    path = tmp_path / "chats.jsonl"
    huge = {"messages": [{"role": "user", "content": "x" * 5000}, CONVERSATIONS[0]["messages"][1]]}
    lines = [json.dumps(CONVERSATIONS[0]), json.dumps(huge), json.dumps(CONVERSATIONS[0])]
    path.write_text("\n".join(lines) + "\n")
    totals = prepare_dataset(
        tokenizer_dir, path, tmp_path / "out", max_record_bytes=1000, progress=None
    )
    assert (totals.too_large, totals.samples, totals.conversations) == (1, 2, 2)


def test_killed_worker_stops_the_command(tmp_path: Path, tokenizer_dir: Path) -> None:
    """SIGKILL of a worker (as the out-of-memory killer would) ends the command with an
    error and no output, instead of hanging."""
    path = tmp_path / "chats.jsonl"
    path.write_text((json.dumps(CONVERSATIONS[1]) + "\n") * 200_000)
    command = [sys.executable, "-m", "ringtrain.cli.data", "prepare", "--tokenizer"]
    command += [str(tokenizer_dir), "--input", str(path), "--output", str(tmp_path / "out")]
    prepare = subprocess.Popen(
        [*command, "--workers", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert "encoding" in prepare.stderr.readline()  # the pool starts right after this line
        worker = _worker_pid(prepare.pid)
        os.kill(worker, signal.SIGKILL)
        _, err = prepare.communicate(timeout=FAILURE_TIMEOUT_S)
    finally:
        prepare.kill()
    assert prepare.returncode == 2, err
    assert "prepare worker process died" in err
    assert not list((tmp_path / "out").glob("*.arrow*"))


def test_a_stop_python_dropped_in_a_finalizer_still_stops_the_encoding(
    tmp_path: Path, tokenizer_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SIGTERM whose exception a finalizer swallowed (Python reports it and goes on) is
    acted on at the next chunk: Terminated, no output."""
    path = tmp_path / "chats.jsonl"
    path.write_text((json.dumps(CONVERSATIONS[1]) + "\n") * 2_000)
    monkeypatch.setattr(sys, "unraisablehook", lambda _report: None)
    with sigterm_taken_as_ctrl_c(), pytest.raises(Terminated):
        stop_inside_a_finalizer()
        prepare_dataset(tokenizer_dir, path, tmp_path / "out", progress=None)
    assert not list((tmp_path / "out").glob("*.arrow*"))


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_prepare_leaves_no_output_and_one_line(
    tmp_path: Path, tokenizer_dir: Path, stop: signal.Signals, workers: int
) -> None:
    """SIGTERM to the command, or a Ctrl-C to its process group (its workers too), while
    it encodes, in worker processes or in its own: exit 128 + the signal, one line naming
    it, no partial file."""
    path = tmp_path / "chats.jsonl"
    path.write_text((json.dumps(CONVERSATIONS[1]) + "\n") * 200_000)
    command = [sys.executable, "-m", "ringtrain.cli.data", "prepare", "--tokenizer"]
    command += [str(tokenizer_dir), "--input", str(path), "--output", str(tmp_path / "out")]
    prepare = start_in_session([*command, "--workers", str(workers)])
    try:
        assert "encoding" in prepare.stderr.readline()
        # The first progress line: the encoding runs.
        assert "conversations" in prepare.stderr.readline()
        send_stop(prepare, stop)
        err = output_or_stacks(prepare, FAILURE_TIMEOUT_S)
    finally:
        prepare.kill()
    assert prepare.returncode == 128 + stop, err
    last = err.strip().splitlines()[-1]
    assert last == f"ringtrain-data: prepare stopped by {stop_name(stop)} before it finished"
    assert "Traceback" not in err
    assert not list((tmp_path / "out").glob("*.arrow*"))


class _StopWhileLocked(Future):
    """A chunk's future that a SIGTERM reaches while it holds its lock, outside a ``with``
    block: the moment in which a stop raised there would leave the lock held."""

    def result(self, timeout: float | None = None) -> str:
        self._condition.acquire()
        signal.raise_signal(signal.SIGTERM)
        self._condition.release()
        return super().result(timeout)


def test_a_stop_while_a_chunk_is_awaited_leaves_its_future_free() -> None:
    """A stop that comes while the next chunk's future holds its lock is raised once that
    lock is released: the pool's manager thread can still set the result, so the pool's
    shutdown returns (a stop raised inside left it waiting for good)."""
    awaited = _StopWhileLocked()
    awaited.set_result("chunk")
    with sigterm_taken_as_ctrl_c(), pytest.raises(Terminated):
        _next_result(deque([awaited]))
    # The lock (reentrant) as another thread, the pool's manager, would take it.
    manager = ThreadPoolExecutor(1)
    assert manager.submit(_take_and_release, awaited._condition).result(timeout=JOIN_S)
    manager.shutdown()


def _take_and_release(lock: threading.Condition) -> bool:
    if not lock.acquire(timeout=JOIN_S):
        return False
    lock.release()
    return True


# A prepare whose third submit to its worker pool meets a SIGTERM inside the pool: after
# the pool has recorded the work item, before it queues the item's id (a stop raised
# there left an item the pool's manager waited for forever: a hang, seen once in 30
# stopped runs). Arguments: tokenizer, input, output.
STOP_INSIDE_SUBMIT = """
import queue, signal, sys, threading
from ringtrain.data.prepare import prepare_dataset
from ringtrain.interrupts import Terminated, sigterm_taken_as_ctrl_c

put, puts = queue.Queue.put, []

def put_after_a_stop(self, item, *args, **kwargs):
    if threading.current_thread() is threading.main_thread():
        puts.append(item)
        if len(puts) == 3:
            signal.raise_signal(signal.SIGTERM)
    return put(self, item, *args, **kwargs)

queue.Queue.put = put_after_a_stop
try:
    with sigterm_taken_as_ctrl_c():
        prepare_dataset(sys.argv[1], sys.argv[2], sys.argv[3], workers=2)
except Terminated:
    sys.exit(143)
"""


def test_a_stop_inside_the_pools_submit_still_ends_the_prepare(
    tmp_path: Path, tokenizer_dir: Path
) -> None:
    """A SIGTERM that arrives inside the worker pool's submit is held until the submit
    returns: the command stops within the time limit, nothing written."""
    path = tmp_path / "chats.jsonl"
    path.write_text((json.dumps(CONVERSATIONS[1]) + "\n") * (8 * 256))
    prepare = start_in_session(
        [sys.executable, "-c", STOP_INSIDE_SUBMIT, str(tokenizer_dir), str(path),
         str(tmp_path / "out")]
    )  # fmt: skip
    try:
        err = output_or_stacks(prepare, FAILURE_TIMEOUT_S)
    finally:
        prepare.kill()
    assert prepare.returncode == 143, err
    assert not list((tmp_path / "out").glob("*.arrow*"))


def _worker_pid(pid: int) -> int:
    """The pid of a pool worker of ``pid`` (a spawned child that is not multiprocessing's
    resource tracker), once one exists; /proc is watched until FAILURE_TIMEOUT_S."""
    children = Path(f"/proc/{pid}/task/{pid}/children")
    deadline = time.monotonic() + FAILURE_TIMEOUT_S
    while time.monotonic() < deadline:
        for child in children.read_text().split():
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
            if b"spawn_main" in cmdline and b"resource_tracker" not in cmdline:
                return int(child)
        time.sleep(POLL_S)
    raise AssertionError(f"process {pid} started no worker in {FAILURE_TIMEOUT_S} s")


def test_only_records_longer_than_the_limit_are_rejected(
    tmp_path: Path,
    tokenizer_dir: Path,
) -> None:
    path = tmp_path / "chats.jsonl"
    short, long = json.dumps(CONVERSATIONS[0]), json.dumps(CONVERSATIONS[1])
    path.write_text(f"{short}\n{long}\n")
    size = len(long.encode()) + 1  # with its newline
    for limit, rejected in ((size, 0), (size - 2, 1)):
        totals = prepare_dataset(
            tokenizer_dir, path, tmp_path / str(limit), max_record_bytes=limit, progress=None
        )
        assert (totals.too_large, totals.samples) == (rejected, 2 - rejected)
