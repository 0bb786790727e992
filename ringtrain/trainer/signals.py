"""SIGTERM/SIGINT handling: stop at a safe point once training runs, leave at once before.

Once this rank's loop has done a unit of work (its ring's first `record_progress`), a
signal asks the loops to stop at a safe point instead of dying mid-step: they poll the
request between steps and the drafters save a checkpoint. The stop waits for the step in
progress however long steps take here, within a bound derived from the longest step this
rank measured (STOP_STEPS of them, plus `ring.startup_timeout_s` for the checkpoint); a
rank still short of its safe point then leaves as failed, naming the bound (the newest
complete checkpoint is kept). ringtrain-launch waits for the ranks rather than killing
them after torch's shutdown timeout (launch.py). Before that, in start-up
(validating inputs, rendezvous, barriers, joining the ring, loading, the first step),
nothing would be lost and the main thread may be blocked in a call that no signal
interrupts (a barrier whose peers are gone, a file lock, a collective): a thread woken
by the signal (through `signal.set_wakeup_fd`) leaves every ring cleanly and ends the
process at once, with exit code 128 + the signal number; unless a peer died, failed or
hung (a launcher stops every rank when one died), which the rank then reports as its
watchdog would have. A signal that reaches a rank already leaving with its outcome said
(it failed; the launcher stops the others once one exits) changes nothing: its exit code
and report stand.
"""

from __future__ import annotations

import os
import signal
import threading
from types import FrameType

from ringtrain.interrupts import STOP_SIGNALS
from ringtrain.ring import Ring, open_rings
from ringtrain.trainer.logs import FILE_ONLY, get_logger
from ringtrain.trainer.outcome import (
    FAILED,
    STOPPED,
    Outcome,
    env_rank,
    launched,
    outcome_reported,
    report_outcome,
)

# A stop may take this many of the longest step measured so far (plus a checkpoint's
# allowance) before the rank gives up on reaching its safe point.
STOP_STEPS = 3


class StopRequest:
    """Set when SIGTERM or SIGINT arrives; the loops poll it between steps."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.signal_name = ""
        self._bounded = False  # the stop's bound is running (bound_stop)

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    def request(self, name: str) -> None:
        self.signal_name = self.signal_name or name
        self._event.set()

    def install(self) -> None:
        """Route SIGTERM and SIGINT to this request, and start the thread that ends the
        process when one arrives during start-up (main thread only)."""

        def handler(signum: int, _frame: FrameType | None) -> None:
            self.request(signal.Signals(signum).name)

        for signum in STOP_SIGNALS:
            signal.signal(signum, handler)
        read_end, write_end = os.pipe()
        os.set_blocking(write_end, False)
        signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
        threading.Thread(
            target=self._watch, args=(read_end,), name="stop-signals", daemon=True
        ).start()

    def _watch(self, read_end: int) -> None:
        """Wake on every caught signal and act on each stop signal (on_stop_signal)."""
        while True:
            for signum in os.read(read_end, 64):
                if signum in STOP_SIGNALS:
                    self.on_stop_signal(signal.Signals(signum))

    def on_stop_signal(self, signum: signal.Signals) -> None:
        """A stop signal during start-up ends the process; one during training starts the
        stop's bound (once); one after the rank said how it ends changes nothing."""
        self.request(signum.name)
        if outcome_reported():
            # The rank is leaving with its outcome said (a launcher stops the others once
            # one rank exits): its exit code and report stand.
            return
        rings = open_rings()
        if not any(ring.own_row.worked for ring in rings):
            # A launcher stops every rank when one died: that death is the report.
            for ring in rings:
                ring.react_to_peer_failure()
            leave_now(signum)
        if not self._bounded:
            self._bounded = True
            threading.Thread(
                target=bound_stop, args=(signum, rings), name="stop-bound", daemon=True
            ).start()


def bound_stop(signum: int, rings: list[Ring]) -> None:
    """Say how long this stop may take; leave as failed if the rank is still running then
    (see the module docstring)."""
    step_s = max(ring.own_row.longest_step_s for ring in rings)
    checkpoint_s = max(ring.spec.startup_timeout_s for ring in rings)
    limit_s = STOP_STEPS * step_s + checkpoint_s
    name = signal.Signals(signum).name
    log = get_logger()
    log.info(
        "%s: finishing the step in progress (the longest so far took %.0f s), then a "
        "checkpoint; stopping within %.0f s",
        name,
        step_s,
        limit_s,
    )
    threading.Event().wait(limit_s)
    message = (
        f"rank {env_rank()} did not reach a safe point within {limit_s:.0f} s of {name} "
        f"({STOP_STEPS} x its longest step, {step_s:.0f} s, + ring.startup_timeout_s for the "
        "checkpoint): left without a checkpoint of this step; the newest complete one is kept"
    )
    log.error("%s", message)
    report_outcome(Outcome(env_rank(), 1, FAILED, message))
    for ring in open_rings():
        ring.fail(message)
    for handler in log.handlers:
        handler.flush()
    os._exit(1)


def leave_now(signum: signal.Signals) -> None:
    """End the process during start-up: close every ring cleanly (peers see a rank that
    left, not one that died; names are unlinked), flush the logs, exit 128 + signum."""
    log = get_logger()
    report_outcome(Outcome(env_rank(), 128 + signum, STOPPED, "during start-up", signum.name))
    log.warning(  # ringtrain-launch says it once for every rank
        "%s during start-up: leaving now (nothing trained yet to save)",
        signum.name,
        extra=FILE_ONLY if launched() else None,
    )
    for ring in open_rings():
        ring.close(clean=True)
    for handler in log.handlers:
        handler.flush()
    os._exit(128 + signum)
