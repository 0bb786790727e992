"""What the drafter ranks all-reduce each step besides the gradients: one vector of sums.

Every number a step needs from all drafters travels in one fp64 vector (StepSums),
reduced after forward and before backward (the gradients go through DDP during
backward: trainer/data_parallel.py): the objective's sums, the tokens trained, the stop
flag, the identity of each drafter's batch, and the sums of the evaluation batches
evaluated meanwhile, kept apart by held-out round (the round being completed and the next
ones: with several targets, one target's shard of the next round can come in the same
step as another's last batches of this one). Each drafter fills only its own part;
ReducedSums reads the summed vector back by name.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from ringtrain.drafter import EvalSums, ObjectiveSums
from ringtrain.trainer.batch_meta import BatchMeta

# One (producer, seq, batch_id) triple per drafter.
BATCH_ID_FIELDS = 3
# Held-out rounds one step can carry sums of: the round being completed and the next ones.
EVAL_ROUNDS_AHEAD = 4


@dataclass
class ReducedSums:
    """One step's sums over every drafter, on the host."""

    block_size: int
    sums_type: type[ObjectiveSums]  # the architecture's sums (its layout of `objective`)
    objective: torch.Tensor  # the objective's sums_type.as_vector() summed
    tokens: int
    stopped: bool  # some drafter found no batch: the step is discarded everywhere
    batches: list[list[int]]  # [producer, seq, batch_id] of each drafter's batch
    # Per held-out round from the one being completed on: the evaluation batches of that
    # round evaluated during the step, and their EvalSums.as_vector() summed.
    eval_batches: list[int]
    eval: list[torch.Tensor]

    def summary(self) -> dict[str, float | list[float]]:
        """Loss, accuracy per slot, tau_uniform and weight sum of the step's training batches."""
        return self.sums_type.summarise(self.objective, self.block_size)

    def step_metrics(self, summary: dict[str, float | list[float]]) -> dict[str, object]:
        """What the step's record reports of `summary` (this step's), by record field."""
        return self.sums_type.step_metrics(summary)


class StepSums:
    """The fp64 vector all-reduced each step, with named sections.

    [objective sums | tokens, stop | (producer, seq, batch_id) per drafter | eval batches
    per round ahead | eval sums per round ahead]"""

    def __init__(
        self,
        block_size: int,
        drafters: int,
        device: torch.device,
        sums_type: type[ObjectiveSums],
    ) -> None:
        self.block_size, self.sums_type = block_size, sums_type
        objective_len = sums_type.vector_len(block_size)
        self._objective = slice(0, objective_len)
        self._tokens = objective_len
        self._stop = objective_len + 1
        ids_start = objective_len + 2
        self._ids = slice(ids_start, ids_start + BATCH_ID_FIELDS * drafters)
        self._eval_batches = slice(self._ids.stop, self._ids.stop + EVAL_ROUNDS_AHEAD)
        eval_len = EvalSums.vector_len(sums_type, block_size)
        self._eval = [
            slice(
                self._eval_batches.stop + k * eval_len, self._eval_batches.stop + (k + 1) * eval_len
            )
            for k in range(EVAL_ROUNDS_AHEAD)
        ]
        self.vector = torch.zeros(self._eval[-1].stop, dtype=torch.float64, device=device)

    def add_training(
        self, drafter_index: int, objective: ObjectiveSums, tokens: int, meta: BatchMeta
    ) -> None:
        """This drafter's training batch: its objective's sums, tokens and identity."""
        self.vector[self._objective] = objective.as_vector()
        self.vector[self._tokens] = float(tokens)
        start = self._ids.start + BATCH_ID_FIELDS * drafter_index
        self.vector[start : start + BATCH_ID_FIELDS] = torch.tensor(
            [meta.producer, meta.seq, meta.batch_id], dtype=torch.float64
        )

    def add_evaluation(self, sums: EvalSums, ahead: int = 0) -> None:
        """One more evaluated batch and its sums, of the held-out round ``ahead`` rounds
        after the one being completed."""
        if not 0 <= ahead < EVAL_ROUNDS_AHEAD:
            raise RuntimeError(
                f"a held-out batch {ahead} rounds after the round being completed: the "
                f"targets' round shards are further apart than the {EVAL_ROUNDS_AHEAD} rounds "
                "a step carries (a miscount of held-out batches)"
            )
        self.vector[self._eval_batches.start + ahead] += 1
        self.vector[self._eval[ahead]] += sums.as_vector()

    def request_stop(self) -> None:
        """This drafter has no batch for the step: every drafter discards it."""
        self.vector[self._stop] = 1.0

    def reduce(self, group: dist.ProcessGroup | None) -> ReducedSums:
        """Sum the vector over the drafters, read it back on the host and start afresh."""
        if group is not None:
            dist.all_reduce(self.vector, group=group)
        host = self.vector.to("cpu", copy=True)
        self.vector.zero_()
        return ReducedSums(
            block_size=self.block_size,
            sums_type=self.sums_type,
            objective=host[self._objective],
            tokens=int(host[self._tokens]),
            stopped=bool(host[self._stop] > 0),
            batches=host[self._ids].view(-1, BATCH_ID_FIELDS).long().tolist(),
            eval_batches=[int(n) for n in host[self._eval_batches]],
            eval=[host[section] for section in self._eval],
        )
