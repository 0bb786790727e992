"""ringtrain.main as ringtrain-launch starts each rank (`python -m ringtrain.rank_entry`).

A Ctrl-C reaches every process of the terminal's group at once, and torch's launcher
forwards it as well. Until a rank installs its own stop handling (trainer/signals.py),
Python would answer SIGINT with a KeyboardInterrupt traceback in the middle of an import
and SIGTERM with a silent death. Here, before the heavy imports, both end the rank at
once with 128 + the signal number and an outcome that says it stopped during start-up,
which ringtrain-launch reports once for every rank.
"""

from __future__ import annotations

import os
import signal
from types import FrameType

from ringtrain.process_end import end_process
from ringtrain.trainer.outcome import STOPPED, Outcome, env_rank, report_outcome


def _leave_during_imports(signum: int, _frame: FrameType | None) -> None:
    for other in (signal.SIGINT, signal.SIGTERM):  # a second signal must not report again
        signal.signal(other, signal.SIG_IGN)
    name = signal.Signals(signum).name
    report_outcome(Outcome(env_rank(), 128 + signum, STOPPED, "during start-up", name))
    os._exit(128 + signum)


def run() -> int:
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _leave_during_imports)
    from ringtrain.main import main

    return main()


if __name__ == "__main__":
    end_process(run())
