"""ringtrain-eval's worker processes (ringtrain.eval.processes) with real spawned workers
and pipes: what each worker returned comes back in order of worker, a worker's exception
is raised in the parent with its traceback, a dead worker is named with its pid and how it
ended, and no worker is left running or unreaped once run_workers has returned."""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import os
import pickle
import signal
import threading
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from typing import Any

import pytest

from ringtrain.eval.processes import WorkerDied, WorkerTraceback, run_workers

# How long a run of two workers may take before the test calls it hung.
HUNG_S = 30


def _outcome(call: Callable[[], Any]) -> dict[str, Any]:
    """``call()``'s value or exception, run in a thread so that a run_workers that never
    returns fails the test instead of hanging it."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = call()
        except BaseException as error:  # handed to the test
            outcome["error"] = error

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(HUNG_S)
    assert not thread.is_alive(), "run_workers did not return"
    return outcome


def _gone(pid: int) -> bool:
    """Whether no process (not even an unreaped one) has ``pid``."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


class Unrebuildable(Exception):
    """An exception that pickles but cannot be unpickled (its __init__ takes two
    arguments, its args hold one)."""

    def __init__(self, conversation: int, reason: str) -> None:
        super().__init__(f"conversation {conversation}: {reason}")


def _raise_unrebuildable(_args: None, _share: tuple[int, int], _pull) -> None:
    raise Unrebuildable(7, "no answer")


def test_an_exception_that_cannot_be_rebuilt_arrives_as_its_text() -> None:
    outcome = _outcome(lambda: run_workers(_raise_unrebuildable, None, 1, [], print))
    error = outcome.get("error")
    assert type(error) is RuntimeError, outcome
    assert str(error) == "Unrebuildable: conversation 7: no answer"
    with pytest.raises(TypeError):  # what the parent would meet, unpickling it as it is
        pickle.loads(pickle.dumps(Unrebuildable(7, "no answer")))


def _die_as_worker_1(_args: None, share: tuple[int, int], pull) -> str:
    """Worker 0 returns at once; worker 1 reports its pid, then is killed by SIGKILL."""
    if share[0] == 1:
        pull(os.getpid())
        os.kill(os.getpid(), signal.SIGKILL)
    return "done"


def test_a_dead_worker_is_named_with_its_pid_and_signal() -> None:
    pids: list[int] = []
    outcome = _outcome(lambda: run_workers(_die_as_worker_1, None, 2, [], pids.append))
    error = outcome.get("error")
    assert isinstance(error, WorkerDied), outcome
    [pid] = pids
    assert str(error).startswith(f"worker 1 of 2 (pid {pid}) was killed by SIGKILL before ")
    assert error.code == 128 + signal.SIGKILL
    assert _gone(pid)


def _fail_once_both_pulled(_args: None, share: tuple[int, int], pull) -> None:
    """Report this worker's pid, then pull until told to fail."""
    report: int | None = os.getpid()
    while True:
        task = pull(report)
        report = None
        if task == "fail":
            raise ValueError(f"worker {share[0]} could not decode its conversation")


def test_a_worker_s_exception_is_raised_with_its_traceback_and_the_others_are_ended() -> None:
    pids: list[int] = []

    def tasks() -> Iterator[str]:
        while len(pids) < 2:  # both workers have pulled: one fails, the other pulls on
            yield "wait"
        yield "fail"
        yield from itertools.repeat("wait")

    outcome = _outcome(lambda: run_workers(_fail_once_both_pulled, None, 2, tasks(), pids.append))
    error = outcome.get("error")
    assert isinstance(error, ValueError), outcome
    assert "could not decode its conversation" in str(error)
    assert isinstance(error.__cause__, WorkerTraceback)
    assert "_fail_once_both_pulled" in str(error.__cause__)
    assert len(pids) == 2
    assert all(_gone(pid) for pid in pids), "a worker is still running or was not reaped"


def _finish_last_as_worker_0(
    ends: tuple[Connection, Connection], share: tuple[int, int], pull
) -> tuple[int, int]:
    """Worker 1 returns at once; worker 0 returns only after worker 1 has ended (the write
    end of ``ends`` closed everywhere) and one more pull has been answered, so worker 1's
    result reaches the parent first."""
    read, write = ends
    if share[0] == 1:
        return share
    write.close()
    pull("closed")  # the parent closes its write end on this report
    with contextlib.suppress(EOFError):  # worker 1, the last holder of the write end, ended
        read.recv()
    pull(None)
    return share


def test_results_come_in_order_of_worker_not_of_finishing() -> None:
    read, write = multiprocessing.Pipe(duplex=False)
    reports: list[str] = []

    def on_report(report: str) -> None:
        reports.append(report)
        write.close()

    try:
        results = _outcome(
            lambda: run_workers(_finish_last_as_worker_0, (read, write), 2, [], on_report)
        )
    finally:
        read.close()
        write.close()
    assert "error" not in results, results
    assert results["value"] == [(0, 2), (1, 2)]
    assert reports == ["closed"]
