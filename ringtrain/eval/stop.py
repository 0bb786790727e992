"""ringtrain-eval stopped by SIGTERM or SIGINT: at once, in one line, with 128 + N.

An evaluation is scored whole (tau and the lossless check over every prompt), so a stop
does not wait for the conversations in progress: the signal raises `EvalStopped` in the
main thread, the worker processes are ended on the way out (ringtrain.eval.processes),
and the command says how far it got. The workers ignore SIGINT (a Ctrl-C reaches every
process of the terminal's group; the parent ends them) and leave quietly when the parent
is gone.
"""

from __future__ import annotations

import signal
from contextlib import AbstractContextManager
from types import FrameType

from ringtrain.interrupts import signals_handled


class EvalStopped(Exception):
    """An evaluation ended by a signal; ``code`` is the exit code (128 + its number) and
    ``done`` / ``total`` the turns decoded before it and in all (set by the evaluation)."""

    def __init__(self, signum: int) -> None:
        self.signal_name = signal.Signals(signum).name
        self.code = 128 + signum
        self.done = 0
        self.total = 0
        super().__init__(self.signal_name)

    def describe(self) -> str:
        where = f"after {self.done} of {self.total} turns" if self.total else "before decoding"
        return (
            f"stopped by {self.signal_name} {where}; nothing reported (tau and the lossless "
            "check are over every prompt: run the command again, with --limit N for fewer "
            "prompts)"
        )


def _stop(signum: int, _frame: FrameType | None) -> None:
    raise EvalStopped(signum)


def stopped_by_signals() -> AbstractContextManager[None]:
    """Raise `EvalStopped` in the main thread when SIGTERM or SIGINT arrives inside."""
    return signals_handled(_stop)
