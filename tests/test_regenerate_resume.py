"""ringtrain-data regenerate is resumable and lossless: a run SIGKILLed or interrupted
and continued with --resume, a torn last line, a changed output file, a server that is
or goes away."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ringtrain.cli.data import main as data_main
from ringtrain.data.regen_client import Sampling
from ringtrain.data.regenerate import RegenerateOptions, regenerate
from ringtrain.testing.chat_server import ChatServer, Faults
from ringtrain.testing.regenerate_chats import (
    MODEL,
    assert_all_regenerated,
    read_output,
    write_chats,
)
from tests.helpers.stops import reset_ctrl_c

ROOT = Path(__file__).resolve().parents[1]


def _args(url: str, chats: Path, output: Path, *extra: str) -> list[str]:
    return [
        "regenerate",
        *("--server", url, "--model", MODEL, "--input", str(chats), "--output", str(output)),
        "--no-progress",
        *extra,
    ]


@pytest.mark.parametrize(
    ("stop", "status"), [(signal.SIGKILL, -9), (signal.SIGINT, 130), (signal.SIGTERM, 143)]
)
def test_stopped_run_resumed_yields_every_record_once(
    tmp_path: Path, stop: signal.Signals, status: int
) -> None:
    chats, output = tmp_path / "chats.jsonl", tmp_path / "out.jsonl"
    good = write_chats(chats, 120)  # 180 requests
    with ChatServer(faults=Faults(hold_after=60)) as server:
        command = [sys.executable, "-m", "ringtrain.cli.data"]
        command += _args(server.url, chats, output, "--concurrency", "8")
        # Ctrl-C as in a terminal: the child takes SIGINT whatever this process ignores
        # (a background job of a non-interactive shell starts with SIGINT ignored).
        process = subprocess.Popen(
            command, cwd=ROOT, stdout=subprocess.DEVNULL, preexec_fn=reset_ctrl_c
        )
        try:
            assert server.held.wait(60), "the run never reached the held answers"
            process.send_signal(stop)
            assert process.wait(60) == status
        finally:
            process.kill()
        # Every worker writes its record before it takes the next one, so with 8 in
        # flight most of the 60 answers are records in the file by now.
        written = read_output(output)
        assert 0 < len(written) < len(good)
        server.open_gate()
        assert data_main(_args(server.url, chats, output, "--resume")) == 0
    assert_all_regenerated(chats, output, good)


def _options(url: str, chats: Path, output: Path) -> RegenerateOptions:
    return RegenerateOptions(
        servers=[url], sampling=Sampling(MODEL), input=chats, output=output, concurrency=4
    )


def test_torn_last_line_is_dropped_and_regenerated(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    chats, output = tmp_path / "chats.jsonl", tmp_path / "out.jsonl"
    good = write_chats(chats, 20)
    with ChatServer() as server:
        regenerate(_options(server.url, chats, output), progress=None)
        lines = output.read_bytes().splitlines(keepends=True)
        output.write_bytes(b"".join(lines[:12]) + lines[12][: len(lines[12]) // 2])
        totals = regenerate(_options(server.url, chats, output), progress=None)
    assert (totals.done_before, totals.written) == (12, 8)
    assert "dropped the torn last line" in capsys.readouterr().err
    assert_all_regenerated(chats, output, good)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda lines: [*lines, lines[2]], "is already in the file"),
        (lambda lines: [lines[0], b'{"messages": []}\n', *lines[1:]], "not a regenerated record"),
    ],
    ids=["duplicate", "foreign-line"],
)
def test_a_changed_output_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture, change, message: str
) -> None:
    chats, output = tmp_path / "chats.jsonl", tmp_path / "out.jsonl"
    write_chats(chats, 6)
    with ChatServer() as server:
        assert data_main(_args(server.url, chats, output)) == 0
        output.write_bytes(b"".join(change(output.read_bytes().splitlines(keepends=True))))
        assert data_main(_args(server.url, chats, output)) == 2
    error = capsys.readouterr().err
    assert f"{output}:" in error and message in error


def test_unreachable_server_stops_with_a_clear_message(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    chats, output = tmp_path / "chats.jsonl", tmp_path / "out.jsonl"
    write_chats(chats, 3)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{probe.getsockname()[1]}/v1"
    assert data_main(_args(url, chats, output)) == 3
    assert f"cannot reach {url}" in capsys.readouterr().err


def test_server_dying_mid_run_stops_the_run_and_a_rerun_finishes(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    chats, output = tmp_path / "chats.jsonl", tmp_path / "out.jsonl"
    good = write_chats(chats, 40)
    extra = ("--retries", "0", "--max-failures", "4", "--concurrency", "4")
    with ChatServer(faults=Faults(dead_after=20)) as dying:
        assert data_main(_args(dying.url, chats, output, *extra)) == 3
    error = capsys.readouterr().err
    # The run stops at the 4th failure in a row; requests already in flight (concurrency
    # 4) may fail too before it has stopped, and the count says how many did.
    failed = re.search(r"(\d+) records in a row failed", error)
    assert failed and 4 <= int(failed[1]) <= 4 + 3, error
    assert "Server disconnected" in error
    assert "rerun the same command to continue" in error
    assert 0 < len(read_output(output)) < len(good)
    with ChatServer() as server:
        assert data_main(_args(server.url, chats, output)) == 0
    assert_all_regenerated(chats, output, good)


@pytest.mark.parametrize(
    ("faults", "gone"),
    [(Faults(error_rate=0.3, seed=2), False), (Faults(dead_after=3), True)],
    ids=["failures-apart", "failures-in-a-row"],
)
def test_the_server_is_gone_after_max_failures_records_in_a_row_only(
    tmp_path: Path, capsys: pytest.CaptureFixture, faults: Faults, gone: bool
) -> None:
    """One conversation at a time, no retries, --max-failures 2: failed records with a
    success between them never stop the run (this seed fails 4 of 12 records, never two in
    a row); a server that stops answering stops it at the second failure, not later."""
    chats, output = tmp_path / "chats.jsonl", tmp_path / "out.jsonl"
    write_chats(chats, 12)
    extra = ("--retries", "0", "--max-failures", "2", "--concurrency", "1")
    with ChatServer(faults=faults) as server:
        code = data_main(_args(server.url, chats, output, *extra))
    errors = (tmp_path / "out.jsonl.errors.jsonl").read_text().splitlines()
    if gone:
        assert code == 3 and len(errors) == 2
        assert "stopped: 2 records in a row failed" in capsys.readouterr().err
    else:
        assert code == 1 and len(errors) == 4
        assert len(read_output(output)) == 8


def test_a_second_client_on_the_output_is_refused_and_a_dead_ones_lock_taken_over(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    chats, output = tmp_path / "chats.jsonl", tmp_path / "out.jsonl"
    good = write_chats(chats, 40)
    with ChatServer(faults=Faults(hold_after=20)) as server:
        command = [sys.executable, "-m", "ringtrain.cli.data"]
        command += _args(server.url, chats, output, "--concurrency", "4")
        first = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL)
        try:
            assert server.held.wait(60), "the first client never reached the held answers"
            asked = len(server.requests)
            # Without the lock this client would wait at the gate too: the timeout fails it.
            second = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
            assert second.returncode == 2, second.stderr
            error = second.stderr
            assert f"pid {first.pid} on host {socket.gethostname()}" in error
            assert "another regenerate client is writing it" in error
            assert len(server.requests) == asked  # the refused client asked nothing
            first.kill()
            assert first.wait(60) == -9
        finally:
            first.kill()
        server.open_gate()
        assert data_main(_args(server.url, chats, output, "--resume")) == 0
    assert f"took over the lock of pid {first.pid}" in capsys.readouterr().err
    assert_all_regenerated(chats, output, good)
