"""What one rank publishes about itself in its row of the ring's rank table: who it is,
how far its main loop got, what it is doing in words, its last error and its GPU busy
share. The peers' watch (watch.py) and `ringtrain-stat` read these rows; the rules of
progress, phases and hangs are in phases.py.

Only the rank's main thread writes progress and phases (set_error may come from any
thread). Nothing is written once the rank left the ring (``closed``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import torch

from ringtrain.ring import control as cb
from ringtrain.ring import phases
from ringtrain.ring.errors import RingError
from ringtrain.ring.liveness import monotonic_ns, own_identity

Result = TypeVar("Result")


class OwnRow:
    """This rank's row of the rank table (``row``, a record of the control block)."""

    def __init__(self, row: np.ndarray) -> None:
        self.row: np.ndarray | None = row
        # Set when the rank leaves the ring: from then on nothing is written.
        self.closed = False
        # Set by the first record_progress(): from then on this rank stops at safe points.
        self.worked = False
        # The longest span between two record_progress() calls (a step, with its waits).
        self.longest_step_s, self._progressed_ns = 0.0, 0
        self._work = b"working"  # what record_progress shows (describe_work)

    def drop(self) -> None:
        """Let go of the row (the control block is about to be unmapped); nothing is
        written from now on."""
        self.closed, self.row = True, None

    def register(self, where: str, device: torch.device) -> None:
        """Claim the row for this process (``where``: the rank, for the error when another
        process holds it): its identity, its device, starting."""
        row = self.row
        if int(row["status"]) != cb.EMPTY:
            raise RingError(f"{where} is already attached by pid {int(row['pid'])}")
        now = monotonic_ns()
        row["pid"], row["start_time"] = own_identity()
        row["device"] = -1 if device.type != "cuda" else (device.index or 0)
        row["attached_ns"] = now
        row["heartbeat_ns"] = now
        row["progress_ns"] = now
        row["active_ns"] = row["still_ns"] = now
        row["phase"] = phases.STARTING
        cb.put_bytes(row, "doing", phases.STARTING_DOING.encode())
        row["gpu_busy"] = -1.0
        row["status"] = cb.ATTACHED

    def report_gpu_busy(self, fraction: float | None) -> None:
        """Publish this rank's GPU busy fraction (None: not measurable here)."""
        if not self.closed:
            self.row["gpu_busy"] = -1.0 if fraction is None else fraction

    def record_progress(self, count: int) -> None:
        """Record how far this rank's main loop got (main thread only): the rank is in
        steady work from now on, its progress and heartbeat are fresh.

        The count is the rank's progress in the run's steps, whatever the trainer counts
        (e.g. a consumer's completed steps; `ringtrain-stat` shows it as `step`)."""
        if self.closed:
            return
        now = monotonic_ns()
        row = self.row
        row["step"] = count
        if int(row["phase"]) != phases.WORKING:
            row["phase"] = phases.WORKING
            cb.put_bytes(row, "doing", self._work)
        row["progress_ns"] = now
        row["heartbeat_ns"] = now
        if self._progressed_ns:
            self.longest_step_s = max(self.longest_step_s, (now - self._progressed_ns) / 1e9)
        self._progressed_ns = now
        self.worked = True

    def start_at(self, count: int) -> None:
        """Show `count` (where a resumed run starts) as this rank's progress until its first
        record_progress, so `ringtrain-stat` shows every rank's step from the start of a
        resumed session; the rank's phase and liveness are unchanged."""
        if not self.closed:
            self.row["step"] = count

    def describe_work(self, doing: str) -> None:
        """Name this rank's steady work (shown from its next record_progress on)."""
        self._work = doing.encode()

    def set_phase(self, doing: str) -> None:
        """Announce what the main thread does next, in words (main thread only): a phase
        with the start-up allowance until the next record_progress (see phases.py)."""
        if self.closed:
            return
        self.row["phase"] = phases.ANNOUNCED
        cb.put_bytes(self.row, "doing", doing.encode())
        self.row["progress_ns"] = monotonic_ns()

    def waiting(self) -> None:
        """Refresh this rank's progress while its main thread waits on a peer outside the
        ring (a producer group's member waiting for its lead's decision): like a ring wait,
        it waits on its peers and is not stuck; a hung peer is named by its own progress."""
        if not self.closed:
            self.row["progress_ns"] = monotonic_ns()

    def phase_marker(self, doing: str) -> Callable[..., None]:
        """A callable (of any arguments) that announces `doing` until the next
        record_progress: for a rank that waits on another's long phase, e.g. a consumer
        waiting in the next step's reduction while another writes a checkpoint."""

        def mark(*_args: Any, **_kwargs: Any) -> None:
            self.set_phase(doing)

        return mark

    def announcing(self, doing: str, call: Callable[..., Result]) -> Callable[..., Result]:
        """`call` run announcing `doing`, back in the previous phase after it (e.g. a
        checkpoint)."""

        def in_phase(*args: Any, **kwargs: Any) -> Result:
            row = self.row
            before = None if self.closed else (int(row["phase"]), phases.doing(row))
            self.set_phase(doing)
            try:
                return call(*args, **kwargs)
            finally:
                if before is not None and not self.closed:
                    row["phase"] = before[0]
                    cb.put_bytes(row, "doing", before[1].encode())
                    row["progress_ns"] = monotonic_ns()

        return in_phase

    def set_error(self, text: str) -> None:
        """Record this rank's last error; peers treat the rank as failed from now on."""
        if self.closed:
            return
        cb.put_bytes(self.row, "error", text.encode("utf-8", "replace"))
        self.row["status"] = cb.FAILED
