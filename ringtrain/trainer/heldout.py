"""Held-out evaluation during training, fed through the ring like training batches.

Targets own the schedule (`EvalRounds`): round k is due after step k * `run.eval_every`,
and a run whose max_steps is not a multiple of it gets a last round after max_steps. A
round is scored with the weights of the step it is due after, and reported in the next
step: each target publishes its shard of the held-out split (every batch of one epoch of
its eval stream, tagged as evaluation batches of that round) right behind the training
batches that the drafters' steps up to that step take from its ring (`EvalSchedule`), so
the drafters meet the round's batches as soon as that step is done, evaluate them before
taking the next step's batch (no gradients, every decoding anchor, decoding replayed: see
ringtrain.drafter.heldout) and add their sums to that step's all-reduce, which completes
the round. Where the drafters are the bottleneck the ring holds several steps' batches,
so a target that waited for the drafters to reach the step would put the round behind
them: it counts the batches instead. With several targets on one ring the count of the
others' training batches is a lower bound (their held-out batches are not told apart): a
round never comes early, but may come a batch or two late, and a batch that comes after
the next step's is scored with that step's weights. After the last training step the
drafters keep taking items until the final round is complete; training batches taken then
are not trained and not recorded, so a resumed run trains them. A checkpoint records the
step of the last round completed, so a resumed run runs every round not recorded before
it, the one due at the resumed step included: first, with the weights of that step, as
the unbroken run did. GPUs never idle for evaluation: it rides in the same pipeline.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ringtrain.data import Batch, BatchStream
from ringtrain.drafter import EvalSums, ObjectiveSums
from ringtrain.ring import Ring


@dataclass(frozen=True)
class EvalRounds:
    """When the held-out rounds are due: round k after step k * eval_every, and a last
    round after max_steps when it is not a multiple of eval_every (none: eval_every = 0).

    A round is known by the step it is due after; a checkpoint records the step of the
    last round completed (`evaluated_step`), so a resumed run runs every later round."""

    eval_every: int
    max_steps: int

    @property
    def count(self) -> int:
        """How many rounds the run has."""
        return -(-self.max_steps // self.eval_every) if self.eval_every else 0

    def step_of(self, round_id: int) -> int:
        """The step that round `round_id` (counted from 1) is due after."""
        return min(round_id * self.eval_every, self.max_steps)

    def done_by(self, evaluated_step: int) -> int:
        """The rounds completed once the round due after `evaluated_step` is (0 for 0)."""
        if not self.eval_every:
            return 0
        return self.count if evaluated_step >= self.max_steps else evaluated_step // self.eval_every


class EvalSchedule:
    """A target's side: when to publish the held-out batches, and which ones.

    The next round goes into the ring once the ring holds the training batches of every
    step up to the one it is due after: (that step - the session's first step) x the
    ring's `consumers` (each drafter step takes one batch per drafter rank), counting this
    producer's training batches exactly and the other `producers - 1`'s from what they
    published less the most held-out batches they can have published."""

    def __init__(
        self,
        stream: BatchStream,
        rounds: EvalRounds,
        evaluated_step: int,
        resumed_step: int = 0,
        producers: int = 1,
        consumers: int = 1,
    ) -> None:
        self.stream = stream
        self.rounds = rounds
        self.next_round = rounds.done_by(evaluated_step) + 1
        self._first_round = self.next_round
        self._resumed_step = resumed_step
        self._producers = producers
        self._consumers = consumers
        self.training_chosen = 0  # training batches this producer chose this session

    def note_training(self) -> None:
        """Count a training batch this producer will publish before its next batch."""
        self.training_chosen += 1

    def due(self, others_published: int) -> bool:
        """Whether the next batch starts the next round, given the items the ring's other
        producers have published so far in this session."""
        if self.next_round > self.rounds.count:
            return False
        rounds_by_others = self.next_round - self._first_round + 1  # this one may have begun
        held_out = (self._producers - 1) * self.stream.batches_per_rank * rounds_by_others
        in_ring = self.training_chosen + max(others_published - held_out, 0)
        steps = self.rounds.step_of(self.next_round) - self._resumed_step
        return in_ring >= steps * self._consumers

    def round_batches(self) -> Iterator[tuple[Batch, int]]:
        """This target's shard of the held-out split, for the round now due."""
        round_id = self.next_round
        self.next_round += 1
        for seq in range(self.stream.batches_per_rank):
            yield self.stream.batch_at(seq), round_id


def others_published(ring: Ring) -> int:
    """Items the ring's producers other than this rank have published in this session."""
    items = ring.control.rank["items"]
    return sum(int(items[i]) for i in ring.spec.producers if i != ring.local_index)


class EvalTally:
    """A drafter's side: global sums of each held-out round, a round completed by batch
    count. Rounds complete in order from `next_round`; a step's sums come per round ahead
    of it (StepSums), so batches of the next round met in the same step are kept for it."""

    def __init__(
        self,
        total_batches: int,
        block_size: int,
        sums_type: type[ObjectiveSums],
        next_round: int = 1,
    ) -> None:
        self.total_batches = total_batches
        self.block_size = block_size
        self.sums_type = sums_type  # the block sums' class (the drafter's architecture's)
        self.next_round = next_round  # the round being completed
        self._batches: dict[int, int] = {}
        self._sums: dict[int, torch.Tensor] = {}

    def ahead(self, round_id: int) -> int:
        """How many rounds after the one being completed round `round_id` is."""
        return round_id - self.next_round

    def absorb(self, batches: list[int], vectors: list[torch.Tensor]) -> list[dict]:
        """Add one step's all-reduced eval sections (per round ahead: the evaluated
        batches and the sums of their EvalSums.as_vector()); returns the metrics of the
        rounds this completes, in order (often none)."""
        for ahead, (count, vector) in enumerate(zip(batches, vectors, strict=True)):
            if count:
                round_id = self.next_round + ahead
                self._batches[round_id] = self._batches.get(round_id, 0) + count
                held = self._sums.get(round_id)
                self._sums[round_id] = vector.clone() if held is None else held + vector
        completed = []
        while (done := self._batches.get(self.next_round)) is not None and (
            done >= self.total_batches
        ):
            del self._batches[self.next_round]
            sums = self._sums.pop(self.next_round)
            completed.append(EvalSums.summarise(sums, self.sums_type, self.block_size))
            self.next_round += 1
        return completed
