"""What a rank publishes in its own row of the ring's rank table (ring/own_row.py), on a
control block in anonymous memory: the row's claim, the phases and their words, progress
a step at a time with the longest step, a resumed rank's step."""

from __future__ import annotations

import os

import pytest
import torch

from ringtrain.ring import RingError, phases
from ringtrain.ring import own_row as own_row_module
from ringtrain.ring.own_row import OwnRow
from tests.helpers import ring_workers as rw

CPU = torch.device("cpu")


class Clock:
    """monotonic_ns as the test sets it."""

    def __init__(self) -> None:
        self.ns = 1_000_000_000

    def advance(self, seconds: float) -> None:
        self.ns += int(seconds * 1e9)

    def __call__(self) -> int:
        return self.ns


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(own_row_module, "monotonic_ns", clock)
    return clock


def registered_row() -> OwnRow:
    block = rw.anonymous_control_block(rw.make_spec("own-row", producers=1, consumers=1))
    row = OwnRow(block.ranks[0])
    row.register("rank 10", CPU)
    return row


def test_a_row_another_process_holds_is_refused_by_name() -> None:
    row = registered_row()
    with pytest.raises(RingError, match=f"rank 10 is already attached by pid {os.getpid()}"):
        OwnRow(row.row).register("rank 10", CPU)


def test_announced_phases_and_steady_work_in_words(clock: Clock) -> None:
    """An announced phase refreshes the progress; the first progress after it is steady
    work under the words describe_work gave; a call run announcing its phase puts the
    phase before it back, with fresh progress."""
    row = registered_row()
    assert int(row.row["phase"]) == phases.STARTING
    assert phases.doing(row.row) == phases.STARTING_DOING
    clock.advance(5)
    row.set_phase("loading the target")
    assert int(row.row["phase"]) == phases.ANNOUNCED
    assert (phases.doing(row.row), int(row.row["progress_ns"])) == ("loading the target", clock.ns)
    row.describe_work("training the drafter")
    clock.advance(5)
    row.record_progress(1)
    assert int(row.row["phase"]) == phases.WORKING
    assert phases.doing(row.row) == "training the drafter"

    def checkpoint() -> str:
        clock.advance(30)
        return f"{int(row.row['phase'])} {phases.doing(row.row)}"

    inside = row.announcing("writing a checkpoint", checkpoint)()
    assert inside == f"{phases.ANNOUNCED} writing a checkpoint"
    assert int(row.row["phase"]) == phases.WORKING
    assert (phases.doing(row.row), int(row.row["progress_ns"])) == (
        "training the drafter",
        clock.ns,
    )


def test_the_longest_step_is_the_longest_span_between_progress(clock: Clock) -> None:
    row = registered_row()
    row.record_progress(1)
    assert row.worked and row.longest_step_s == 0.0  # the first progress ends no step
    for step, seconds in ((2, 3.0), (3, 1.0)):
        clock.advance(seconds)
        row.record_progress(step)
    assert row.longest_step_s == 3.0 and int(row.row["step"]) == 3


def test_a_resumed_rank_shows_its_step_before_its_first_progress() -> None:
    row = registered_row()
    row.start_at(40)
    assert int(row.row["step"]) == 40 and int(row.row["phase"]) == phases.STARTING
    assert not row.worked
