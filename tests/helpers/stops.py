"""Commands started as from a terminal and stopped as a scheduler or a user stops them."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from typing import Any


def reset_ctrl_c() -> None:
    """Ctrl-C as in a terminal in the child, whatever this process ignores (a background
    job of a non-interactive shell starts with SIGINT ignored, and its children with it)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_in_session(command: list[str], **options: Any) -> subprocess.Popen:
    """``command`` in a session of its own (its own process group, as a terminal's
    foreground job), Ctrl-C as in a terminal, stdout and stderr piped as text, Python's
    stacks printed on SIGABRT (`output_or_stacks`)."""
    env = {**options.pop("env", os.environ), "PYTHONFAULTHANDLER": "1"}
    return subprocess.Popen(
        command,
        stdout=options.pop("stdout", subprocess.PIPE),
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=reset_ctrl_c,
        env=env,
        **options,
    )


def send_stop(process: subprocess.Popen, stop: signal.Signals) -> None:
    """SIGTERM to the process (a scheduler's, `timeout`'s), SIGINT to its group (a
    terminal's Ctrl-C reaches every process of the group, workers too)."""
    if stop == signal.SIGTERM:
        os.kill(process.pid, stop)
    else:
        os.killpg(process.pid, stop)


def stop_name(stop: signal.Signals) -> str:
    """How the commands name the stop."""
    return "SIGTERM" if stop == signal.SIGTERM else "Ctrl-C"


def _next_call() -> None:
    """A call: Python runs a pending signal handler when a function starts."""


class _StoppedWhileFinalized:
    """An object whose finalizer is running when its stop arrives."""

    def __init__(self, stop: signal.Signals) -> None:
        self.stop = stop

    def __del__(self) -> None:
        signal.pthread_kill(threading.get_ident(), self.stop)
        _next_call()  # the handler raises here, inside the finalizer


def stop_inside_a_finalizer(stop: signal.Signals = signal.SIGTERM) -> None:
    """`stop` (SIGTERM unless given) to this thread while a finalizer runs: its handler's
    exception is reported as unraisable and dropped by Python (the stop a command must not
    lose)."""
    _StoppedWhileFinalized(stop)


def output_or_stacks(process: subprocess.Popen, timeout_s: float) -> str:
    """The stderr of ``process`` once it exits within ``timeout_s``; else (a hang) fail
    with each of its threads' Python stack, which it prints on SIGABRT when started with
    PYTHONFAULTHANDLER set (`start_in_session` sets it)."""
    try:
        return process.communicate(timeout=timeout_s)[1]
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGABRT)
        process.wait(timeout=30)
        # Its children (a pool's workers) may hold the pipes open: end the whole group.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        stacks = process.communicate(timeout=30)[1]
        raise AssertionError(
            f"still running {timeout_s:g} s after the stop; its threads:\n{stacks[-6000:]}"
        ) from None
