"""The target rank's progress: the run's step it works for, and a log line every few steps.

A target rank records the run's training step (the drafters' step, or the step a resume
starts from until the drafters' first) as its progress in the ring, so `ringtrain-stat`
shows the same step for every rank. Every run.log_every of those steps its log gets one
line: batches published (in this session), tokens/s, the ring's occupancy and how much
of the time this rank waited for a free slot.
"""

from __future__ import annotations

import os
import time

from ringtrain.ring import Ring, with_interval
from ringtrain.trainer.logs import get_logger


class TargetProgress:
    """Counts a target rank's forward passes and logs a line every `every` run steps."""

    def __init__(self, ring: Ring, every: int, resumed_step: int) -> None:
        self._ring = ring
        self._every = max(every, 1)
        self._resumed_step = resumed_step
        self._line_step = resumed_step
        self._before = ring.snapshot()
        self._window_start = time.perf_counter()
        self._window_tokens = 0
        self.produced = 0

    def run_step(self) -> int:
        """The run's training step: the drafters' (the resumed step until their first)."""
        return max(self._resumed_step, self._ring.consumer_step())

    def forward_done(self, tokens: int) -> int:
        """Count one forward pass of `tokens` tokens; log a line when the run passed the
        next multiple of `every`. Returns the run's step."""
        self.produced += 1
        self._window_tokens += tokens
        step = self.run_step()
        if step // self._every > self._line_step // self._every:
            self._log_line(step)
        return step

    def _log_line(self, step: int) -> None:
        now_s = time.perf_counter()
        current = self._ring.snapshot()
        window = with_interval(self._before, current)
        mine = next((r for r in window.ranks if r.pid == os.getpid()), None)
        blocked = None if mine is None else mine.interval_blocked_pct
        get_logger().info(
            "step %d | %d batches produced this session | %s tok/s | ring %.0f%% occupied%s",
            step,
            self.produced,
            f"{self._window_tokens / max(now_s - self._window_start, 1e-9):,.0f}",
            100 * window.occupancy,
            "" if blocked is None else f" | waited for a free slot {blocked:.0f}% of the time",
        )
        self._before, self._window_start, self._window_tokens = current, now_s, 0
        self._line_step = step
