"""How ringtrain's data and evaluation commands stop on SIGTERM and Ctrl-C.

A scheduler or `timeout` stops a command with SIGTERM. ringtrain-data takes it as a
Ctrl-C (a KeyboardInterrupt, or for a local regenerate the first Ctrl-C's orderly stop:
the answers in flight finish and are written), so what was written is kept and a rerun
continues it; the last line names the stop, and the exit status is 128 + the signal's
number (143 for SIGTERM, 130 for Ctrl-C), as a shell reports a process it killed.

Worker processes start inside `stops_deferred`: a stop that arrives while a pool or a
worker starts is acted on once it has started (half-started, the pool cannot be shut
down and the child dies reading its start-up data). A Ctrl-C reaches every process of
the terminal's group, and it is the parent's alone to act on (it ends its workers): a
worker starts with both signals blocked (it inherits the mask `stops_deferred` set) and
its first call, `set_worker_stops`, ignores Ctrl-C before it unblocks them, so a Ctrl-C
that reaches a worker still importing is dropped there instead of ending it with a
KeyboardInterrupt.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as ResultNotYet
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

T = TypeVar("T")

# The signals that ask a ringtrain process to stop (a scheduler's, a terminal's).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
CTRL_C = "Ctrl-C"
SIGTERM = "SIGTERM"
EXIT_STATUS = {CTRL_C: 128 + signal.SIGINT, SIGTERM: 128 + signal.SIGTERM}
# The longest a stop waits while a worker's result is awaited (`result_between_stops`).
STOP_WAIT_S = 0.2


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: handled wherever a Ctrl-C is."""


# The stops taken inside `sigterm_taken_as_ctrl_c`. Python runs a signal handler in the
# main thread at its next instruction, which may be inside a finalizer or a callback:
# there the exception is printed ("Exception ignored in ...") and the work goes on, so a
# command's loop asks `raise_taken_stop` between its units of work.
_TAKEN: list[type[KeyboardInterrupt]] = []


def _taken(signum: int, _frame: FrameType | None) -> None:
    stop = Terminated if signum == signal.SIGTERM else KeyboardInterrupt
    _TAKEN.append(stop)
    raise stop


Handler = Callable[[int, FrameType | None], Any]


@contextmanager
def signals_handled(handler: Handler, signums: Iterable[int] = STOP_SIGNALS) -> Iterator[None]:
    """``handler`` for ``signums`` inside, the previous handlers restored on the way out.
    Off the main thread, where no handler can be set, nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, handler) for signum in signums}
    try:
        yield
    finally:
        for signum, before in previous.items():
            signal.signal(signum, before)


@contextmanager
def sigterm_taken_as_ctrl_c() -> Iterator[None]:
    """SIGTERM raises `Terminated` and Ctrl-C KeyboardInterrupt in the main thread inside,
    each remembered for `raise_taken_stop` (Ctrl-C only where Python's own handler had
    it: a process started with it ignored, as a shell's background job, keeps ignoring it)."""
    signums = [signal.SIGTERM]
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signums.append(signal.SIGINT)
    _TAKEN.clear()
    try:
        with signals_handled(_taken, signums):
            yield
    finally:
        _TAKEN.clear()


def raise_taken_stop() -> None:
    """Raise again the first stop taken inside `sigterm_taken_as_ctrl_c` (one whose
    exception a finalizer swallowed would otherwise be lost); nothing if none was."""
    if _TAKEN:
        raise _TAKEN[0]()


def stop_name(stop: KeyboardInterrupt) -> str:
    """What stopped the command: SIGTERM or Ctrl-C."""
    return SIGTERM if isinstance(stop, Terminated) else CTRL_C


def report_stop(name: str, kept: str, output: Path) -> int:
    """Say that the command was stopped and what it kept; returns the exit status."""
    print(
        f"ringtrain-data: stopped by {name}; the {kept} written are kept in {output}: "
        "rerun the same command to continue",
        file=sys.stderr,
    )
    return EXIT_STATUS[name]


def report_unfinished(command: str, stop: KeyboardInterrupt) -> int:
    """Say that ``command``, whose output is all or nothing, was stopped before it
    finished (nothing was written); returns the exit status."""
    name = stop_name(stop)
    print(f"{command} stopped by {name} before it finished", file=sys.stderr)
    return EXIT_STATUS[name]


@contextmanager
def stops_deferred() -> Iterator[None]:
    """SIGTERM and SIGINT held back inside and raised again on the way out (the first of
    them), to the handlers in place outside. The calling thread blocks both inside, so a
    process started there begins with them blocked (see `set_worker_stops`)."""
    held: list[int] = []
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        with signals_handled(lambda signum, _frame: held.append(signum)):
            yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # one still pending arrives here
        if held:
            signal.raise_signal(held[0])


def result_between_stops(future: Future[T]) -> T:
    """``future.result()``, its waits with stops held and a stop raised between them (waits
    of at most ``STOP_WAIT_S``). A stop raised inside ``Future.result`` just after it took
    the future's lock, before its ``with`` block began, leaves that lock held: the pool's
    manager thread, which takes it to set the result, then blocks for good, and so does
    the pool's shutdown (seen: a SIGTERM to `prepare --workers 2` that hung)."""
    while True:
        with stops_deferred():
            try:
                return future.result(timeout=STOP_WAIT_S)
            except ResultNotYet:
                continue


def _leave(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def set_worker_stops() -> None:
    """A worker process's first call. Ctrl-C is ignored: it reaches every process of the
    terminal's group, and it is the parent's to act on (it ends its workers). SIGTERM, the
    parent ending it, leaves through SystemExit, so that the worker's finalizers release
    what it holds (killed outright, its semaphores are reported leaked). A worker started
    inside `stops_deferred` has both blocked until here: a Ctrl-C that came while it
    imported is dropped, a SIGTERM acted on now."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _leave)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
