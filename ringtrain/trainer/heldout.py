"""Held-out evaluation during training, fed through the ring like training batches.

Targets own the schedule: each target watches the drafters' step in the ring's control
block, and once it reaches the next multiple of `run.eval_every` it publishes its shard
of the held-out split (every batch of one epoch of its eval stream) tagged as evaluation
batches of that round, then goes back to training batches. Drafters evaluate such a
batch on the spot (no gradients, every decoding anchor, decoding replayed: see
ringtrain.drafter.heldout) and add its sums to the next step's all-reduce, so every
drafter knows when the round's batches have all been evaluated. After the last training
step the drafters keep taking items until the final round (if one is due) is complete;
training batches taken then are not trained and not recorded, so a resumed run trains
them. GPUs never idle for evaluation: it rides in the same pipeline.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from ringtrain.data import Batch, BatchStream
from ringtrain.drafter import EvalSums


class EvalSchedule:
    """A target's side: when to publish the held-out batches, and which ones."""

    def __init__(self, stream: BatchStream, eval_every: int, resumed_step: int) -> None:
        self.stream = stream
        self.eval_every = eval_every
        self.next_round = resumed_step // eval_every + 1

    def due(self, drafter_step: int) -> bool:
        return drafter_step >= self.next_round * self.eval_every

    def round_batches(self) -> Iterator[tuple[Batch, int]]:
        """This target's shard of the held-out split, for the round now due."""
        round_id = self.next_round
        self.next_round += 1
        for seq in range(self.stream.batches_per_rank):
            yield self.stream.batch_at(seq), round_id


def final_round(max_steps: int, eval_every: int) -> int:
    """The round the targets start at the last step (0: none is due then)."""
    return max_steps // eval_every if eval_every and max_steps % eval_every == 0 else 0


class EvalTally:
    """A drafter's side: global sums of the current round, completed by batch count."""

    def __init__(self, total_batches: int, block_size: int, rounds_done: int) -> None:
        self.total_batches = total_batches
        self.block_size = block_size
        self._sums: torch.Tensor | None = None
        self._batches = 0
        self.completed_rounds = rounds_done

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
        self.completed_rounds += 1
        metrics["round"] = self.completed_rounds
        return metrics
