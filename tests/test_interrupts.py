"""Stops held back while worker processes start (ringtrain/interrupts.py), with real
signals and a real child process."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from collections.abc import Callable

import pytest

from ringtrain.interrupts import (
    Terminated,
    raise_taken_stop,
    sigterm_taken_as_ctrl_c,
    stops_deferred,
)
from tests.helpers.stops import reset_ctrl_c, stop_inside_a_finalizer, stop_name

# A worker as ringtrain's start: it says it runs (still "importing"), waits for a line,
# then makes its first call, set_worker_stops, and says it survived.
WORKER = """
import sys
print("importing", flush=True)
sys.stdin.readline()
from ringtrain.interrupts import set_worker_stops
set_worker_stops()
print("stops set", flush=True)
"""
# A command's loop as ringtrain's data commands run it: inside sigterm_taken_as_ctrl_c
# it says it is ready, waits for a line (a unit of work), then asks for a stop taken
# meanwhile, as between units of work, and says it finished.
COMMAND = """
import sys
from ringtrain.interrupts import raise_taken_stop, report_unfinished, sigterm_taken_as_ctrl_c

def next_call():
    pass  # a call: Python runs a pending signal handler when a function starts

try:
    with sigterm_taken_as_ctrl_c():
        print("ready", flush=True)
        sys.stdin.readline()
        next_call()
        raise_taken_stop()
    print("finished", flush=True)
except KeyboardInterrupt as stop:
    sys.exit(report_unfinished("the command", stop))
"""
TIMEOUT_S = 60


def test_a_stop_inside_is_raised_on_the_way_out() -> None:
    # Python's own Ctrl-C handler outside, whatever this process was started with (a
    # background job of a non-interactive shell starts with SIGINT ignored).
    started_with = signal.signal(signal.SIGINT, signal.default_int_handler)
    finished = False
    try:
        with pytest.raises(KeyboardInterrupt), stops_deferred():
            # To this thread: sent to the process, another thread (pytest's) could take it
            # and Python act on it only later.
            signal.pthread_kill(threading.get_ident(), signal.SIGINT)
            finished = True
        outside = signal.getsignal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, started_with)
    assert finished
    assert outside is signal.default_int_handler
    assert not signal.pthread_sigmask(signal.SIG_BLOCK, []) & {signal.SIGINT, signal.SIGTERM}


def _child(code: str, preexec: Callable[[], None]) -> subprocess.Popen:
    """Python running `code`, its standard streams on pipes, `preexec` run in it first."""
    return subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=preexec,
    )


def _signalled(child: subprocess.Popen, ready: str, stop: signal.Signals) -> tuple[int, str, str]:
    """Once `child` prints `ready`, send it `stop`, then "go on"; its exit status and the
    rest of its output and its errors."""
    try:
        assert child.stdout.readline() == ready
        child.send_signal(stop)
        out, err = child.communicate("go on\n", timeout=TIMEOUT_S)
    finally:
        child.kill()
    return child.returncode, out, err


@pytest.mark.parametrize(
    ("stop", "status"), [(signal.SIGINT, 0), (signal.SIGTERM, 143)], ids=["ctrl-c", "sigterm"]
)
def test_a_worker_started_inside_is_not_ended_by_a_stop_while_it_imports(
    stop: signal.Signals, status: int
) -> None:
    """A Ctrl-C that reaches a worker before its first call is dropped (it is the parent's
    to act on); a SIGTERM ends it through SystemExit once the worker can act (143), not
    half-way through its imports."""
    with stops_deferred():
        worker = _child(WORKER, reset_ctrl_c)
    returncode, out, err = _signalled(worker, "importing\n", stop)
    assert returncode == status, err
    assert ("stops set" in out) == (stop == signal.SIGINT), out
    assert "KeyboardInterrupt" not in err


def test_a_stop_a_finalizer_swallowed_is_raised_again_between_units_of_work(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Terminated raised inside a finalizer is reported and dropped by Python; the
    command's loop still stops at its next unit of work, and nothing is remembered outside."""
    dropped: list[type[BaseException]] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda report: dropped.append(report.exc_type))
    with sigterm_taken_as_ctrl_c():
        stop_inside_a_finalizer()
        went_on = True  # Python dropped the stop
        with pytest.raises(Terminated):
            raise_taken_stop()
    assert went_on and dropped == [Terminated]
    raise_taken_stop()  # outside: none taken


def _ctrl_c_ignored() -> None:
    """Ctrl-C ignored in the child, as in a background job of a non-interactive shell."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize(
    ("stop", "status"), [(signal.SIGINT, 0), (signal.SIGTERM, 143)], ids=["ctrl-c", "sigterm"]
)
def test_a_command_started_with_ctrl_c_ignored_keeps_ignoring_it(
    stop: signal.Signals, status: int
) -> None:
    """A command started as a background job (SIGINT ignored) runs on through a Ctrl-C and
    finishes (exit 0); a SIGTERM still stops it, with 143 and its last line naming it."""
    returncode, out, err = _signalled(_child(COMMAND, _ctrl_c_ignored), "ready\n", stop)
    assert returncode == status, err
    if stop == signal.SIGINT:
        assert out == "finished\n" and err == "", err
    else:
        assert out == "" and err == "the command stopped by SIGTERM before it finished\n", err


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_ctrl_c_a_finalizer_swallowed_is_raised_again_as_a_ctrl_c(
    stop: signal.Signals, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ctrl-C (as a SIGTERM) whose exception Python dropped inside a finalizer still
    stops the command at its next unit of work, named as what it was."""
    dropped: list[type[BaseException]] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda report: dropped.append(report.exc_type))
    # Python's own Ctrl-C handler outside, as in a command started from a terminal.
    started_with = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with sigterm_taken_as_ctrl_c():
            stop_inside_a_finalizer(stop)
            with pytest.raises(KeyboardInterrupt) as raised:
                raise_taken_stop()
    finally:
        signal.signal(signal.SIGINT, started_with)
    assert stop_name(stop) == ("SIGTERM" if raised.type is Terminated else "Ctrl-C")
    assert len(dropped) == 1 and issubclass(dropped[0], KeyboardInterrupt)
