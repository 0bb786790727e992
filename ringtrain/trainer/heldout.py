"""Held-out evaluation during training, fed through the ring like training batches.

Targets own the schedule (`EvalRounds`): round k is due after step k * `run.eval_every`,
and a run whose max_steps is not a multiple of it gets a last round after max_steps. Each
target watches the drafters' step in the ring's control block, and once it reaches the
step the next round is due after, it publishes its shard of the held-out split (every
batch of one epoch of its eval stream) tagged as evaluation batches of that round, then
goes back to training batches. Drafters evaluate such a batch on the spot (no gradients,
every decoding anchor, decoding replayed: see ringtrain.drafter.heldout) and add its sums
to the next step's all-reduce, so every drafter knows when the round's batches have all
been evaluated; the round is reported as after the step it was due after, although it
completes a few steps later. After the last training step the drafters keep taking items
until the final round is complete; training batches taken then are not trained and not
recorded, so a resumed run trains them. A checkpoint records the step of the last round
completed, so a resumed run runs every round not recorded before it, the one due at the
resumed step included. GPUs never idle for evaluation: it rides in the same pipeline.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from ringtrain.data import Batch, BatchStream
from ringtrain.drafter import EvalSums


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
    """A target's side: when to publish the held-out batches, and which ones."""

    def __init__(self, stream: BatchStream, rounds: EvalRounds, evaluated_step: int) -> None:
        self.stream = stream
        self.rounds = rounds
        self.next_round = rounds.done_by(evaluated_step) + 1

    def due(self, drafter_step: int) -> bool:
        """Whether the drafters reached the step the next round is due after."""
        return self.next_round <= self.rounds.count and drafter_step >= self.rounds.step_of(
            self.next_round
        )

    def round_batches(self) -> Iterator[tuple[Batch, int]]:
        """This target's shard of the held-out split, for the round now due."""
        round_id = self.next_round
        self.next_round += 1
        for seq in range(self.stream.batches_per_rank):
            yield self.stream.batch_at(seq), round_id


class EvalTally:
    """A drafter's side: global sums of the current round, completed by batch count
    (rounds complete in order, so the drafter numbers them)."""

    def __init__(self, total_batches: int, block_size: int) -> None:
        self.total_batches = total_batches
        self.block_size = block_size
        self._sums: torch.Tensor | None = None
        self._batches = 0

    def absorb(self, batches: int, vector: torch.Tensor) -> dict | None:
        """Add one step's all-reduced eval section (`batches` evaluated batches, the sums of
        their EvalSums.as_vector()); the round's metrics once it is complete, else None."""
        if batches == 0:
            return None
        self._batches += batches
        self._sums = vector.clone() if self._sums is None else self._sums + vector
        if self._batches < self.total_batches:
            return None
        metrics = EvalSums.summarise(self._sums, self.block_size)
        self._sums = None
        self._batches = 0
        return metrics
