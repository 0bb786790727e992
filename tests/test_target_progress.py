"""A target rank's progress lines: one each time the run passes a multiple of
run.log_every, with the window's tokens/s and this rank's wait for a free slot."""

from __future__ import annotations

import logging
import os
from dataclasses import replace

import pytest

from ringtrain.ring import RingSnapshot
from ringtrain.trainer import target_progress as target_progress_module
from ringtrain.trainer.logs import LOGGER_NAME
from ringtrain.trainer.target_progress import TargetProgress
from tests.helpers.clock import Clock, set_clock
from tests.helpers.ring_snapshots import rank, snapshot


class RunRing:
    """A ring at the drafters' step `step` whose counters the test sets: this process is
    target rank 0, blocked `blocked_s` of its `up_s` seconds."""

    def __init__(self) -> None:
        self.step, self.up_s, self.blocked_s = 0, 0.0, 0.0

    def consumer_step(self) -> int:
        return self.step

    def snapshot(self) -> RingSnapshot:
        target = replace(
            rank(0, "target", 0, max(self.up_s, 1e-3), self.blocked_s),
            pid=os.getpid(),
        )
        return snapshot([target, rank(1, "drafter", 0, 1.0, 0.0)], taken_s=self.up_s)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    return set_clock(monkeypatch, target_progress_module)


def test_a_line_each_time_the_run_passes_a_multiple_of_log_every(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    ring = RunRing()
    progress = TargetProgress(ring, every=10, resumed_step=0)
    with caplog.at_level(logging.INFO, logger=LOGGER_NAME):
        # Ten forwards of 1,000 tokens over 4 s while the drafters reach step 9: no line.
        for second in range(1, 11):
            clock.now, ring.up_s, ring.step = 0.4 * second, 0.4 * second, second - 1
            assert progress.forward_done(1000) == second - 1
        assert not caplog.messages
        # The drafters pass step 10 (at 12): one line over the 11 forwards so far, 5 s,
        # the target blocked 2.5 of them.
        clock.now, ring.up_s, ring.blocked_s, ring.step = 5.0, 5.0, 2.5, 12
        assert progress.forward_done(1000) == 12
        # Within the same multiple no second line; past the next, a line over its window.
        clock.now, ring.up_s, ring.step = 6.0, 6.0, 19
        progress.forward_done(4000)
        clock.now, ring.up_s, ring.blocked_s, ring.step = 7.0, 7.0, 2.5, 20
        progress.forward_done(4000)
    assert caplog.messages == [
        "step 12 | 11 batches produced this session | 2,200 tok/s | ring 100% occupied"
        " | waited for a free slot 50% of the time",
        "step 20 | 13 batches produced this session | 4,000 tok/s | ring 100% occupied"
        " | waited for a free slot 0% of the time",
    ]


def test_a_resumed_run_counts_from_its_step_until_the_drafters_pass_it() -> None:
    ring = RunRing()
    progress = TargetProgress(ring, every=10, resumed_step=40)
    ring.step = 3  # the drafters' step before their first after the resume
    assert progress.run_step() == 40
    ring.step = 41
    assert progress.run_step() == 41
