"""When a target publishes a held-out round: right behind the training batches of the
steps up to the one the round is due after, counted in the ring (the other targets' items
read from the ring's control block), never before them."""

from __future__ import annotations

from ringtrain.trainer.heldout import EvalRounds, EvalSchedule, others_published
from tests.helpers import ring_workers as rw


class HeldOut:
    """What EvalSchedule reads of a held-out stream: its batches per round, each batch."""

    batches_per_rank = 3

    def batch_at(self, seq: int) -> int:
        return seq


def test_a_round_follows_the_training_batches_of_its_step_on_the_ring() -> None:
    # Round 1 is due after step 4; two drafters take one batch each per step.
    schedule = EvalSchedule(HeldOut(), EvalRounds(4, 10), 0, consumers=2)
    for _ in range(7):
        schedule.note_training()
        assert not schedule.due(others_published=0)
    schedule.note_training()
    assert schedule.due(others_published=0)
    assert list(schedule.round_batches()) == [(0, 1), (1, 1), (2, 1)]
    assert not schedule.due(others_published=0)  # round 2 after step 8: 16 batches
    for _ in range(8):
        schedule.note_training()
    assert schedule.due(others_published=0)


def test_a_resumed_session_publishes_the_round_of_its_first_step_first() -> None:
    """Resumed at step 4 with round 1 (due after step 4) not completed before the
    checkpoint: the round goes first, so the drafters score it with step 4's weights."""
    schedule = EvalSchedule(HeldOut(), EvalRounds(4, 10), 0, resumed_step=4)
    assert schedule.due(others_published=0)
    done = EvalSchedule(HeldOut(), EvalRounds(4, 10), 4, resumed_step=4)
    assert not done.due(others_published=0)  # round 1 is recorded: round 2 after step 8


def test_other_targets_count_only_as_far_as_their_batches_must_be_training() -> None:
    """Two targets on a ring, one drafter: the other target's 5 published items may hold
    this round's 3 held-out batches, so they count as 2 training batches."""
    schedule = EvalSchedule(HeldOut(), EvalRounds(4, 10), 0, producers=2, consumers=1)
    schedule.note_training()
    assert not schedule.due(others_published=4)  # 1 + (4 - 3) = 2 < 4
    assert schedule.due(others_published=6)  # 1 + (6 - 3) = 4


def test_no_round_is_due_after_the_last_one() -> None:
    schedule = EvalSchedule(HeldOut(), EvalRounds(4, 4), 4, resumed_step=4)
    assert not schedule.due(others_published=100)


def test_the_others_published_items_are_those_of_the_rings_other_producers() -> None:
    """Three targets on one ring: each counts the items the other two published, not its
    own (nor a drafter's)."""
    rings = rw.in_process_ranks(producers=3, consumers=1, slots_per_producer=4)
    try:
        for ring, count in zip(rings[:3], (1, 2, 3), strict=True):
            producer = ring.producer()
            for seq in range(count):
                rw.publish(producer, seq)
        assert [others_published(ring) for ring in rings[:3]] == [5, 4, 3]
    finally:
        rw.close_ranks(rings)
