"""The sums a drafter's batch yields, and their layout as one fp64 vector.

A batch's objective (and a held-out batch's evaluation) returns *sums*, never means, so
the trainer can all-reduce them over the drafters and normalise by global counts. Each
sums class declares its fields once; a field is one number, or one number per scored
slot k = 1 .. B - 1 (marked `PER_SLOT`). `as_vector` packs the fields in declaration
order and `unpack` reads a (reduced) vector back by name: no other module knows the
vector's offsets.

An architecture whose block objective adds a loss of its own (drafter/arch/base.py)
yields a subclass with one field per such part of `loss_sum`, marked `LOSS_PART` and
named ``<metric>_sum``: the metrics report each beside the loss as ``<metric>`` (its
part of the normalised loss), in step records and evaluation records alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch

# Metadata of a field that holds one number per scored slot (B - 1 of them).
PER_SLOT = {"per_slot": True}
# Metadata of a field that holds a part of loss_sum (reported apart, see the docstring).
LOSS_PART = {"loss_part": True}
# A training step's record field -> summarise's metric it reports (the others are for
# normalising and for evaluation records); the loss parts come beside them.
STEP_METRICS = {"loss": "loss", "accuracy": "accuracy_per_slot", "tau_uniform": "tau_uniform"}


@dataclass(frozen=True)
class ObjectiveSums:
    """Sums over one batch (tensors on the batch's device); backward on loss_sum."""

    loss_sum: torch.Tensor  # sum of w_k * CE over scored labels (differentiable)
    weight_sum: torch.Tensor  # the normaliser (see the objective: drafter/objectives.py)
    correct: torch.Tensor = field(
        metadata=PER_SLOT
    )  # [B - 1] scored labels predicted right, per slot
    counted: torch.Tensor = field(metadata=PER_SLOT)  # [B - 1] scored labels per slot
    accepted_sum: torch.Tensor  # sum over blocks of the correct prefix length of slots 1..B-1
    block_count: torch.Tensor  # real (non-padding) blocks

    @classmethod
    def layout(cls, block_size: int) -> dict[str, slice]:
        """Where each field lies in as_vector() for blocks of `block_size`."""
        offsets, cursor = {}, 0
        for f in fields(cls):
            width = block_size - 1 if f.metadata.get("per_slot") else 1
            offsets[f.name] = slice(cursor, cursor + width)
            cursor += width
        return offsets

    @classmethod
    def vector_len(cls, block_size: int) -> int:
        """Length of as_vector() for blocks of `block_size`."""
        return sum(s.stop - s.start for s in cls.layout(block_size).values())

    @classmethod
    def loss_parts(cls) -> dict[str, str]:
        """The metric each loss-part field is reported as, by field name."""
        return {
            f.name: f.name.removesuffix("_sum") for f in fields(cls) if f.metadata.get("loss_part")
        }

    @classmethod
    def unpack(cls, vector: torch.Tensor, block_size: int) -> dict[str, float | list[float]]:
        """The fields of a (possibly all-reduced) as_vector() by name: a float, or a list
        for the per-slot fields."""
        values = vector.tolist()
        return {
            f.name: values[s] if f.metadata.get("per_slot") else values[s.start]
            for f, s in zip(fields(cls), cls.layout(block_size).values(), strict=True)
        }

    def as_vector(self) -> torch.Tensor:
        """All sums, detached, in one fp64 vector (one all-reduce for every metric)."""
        parts = [getattr(self, f.name).detach().double().reshape(-1) for f in fields(self)]
        return torch.cat(parts)

    def plus(self, other: ObjectiveSums) -> ObjectiveSums:
        """Field-wise sum with another batch's sums of the same class."""
        return type(self)(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    @classmethod
    def summarise(cls, vector: torch.Tensor, block_size: int) -> dict[str, float | list[float]]:
        """Metrics from a (possibly all-reduced) as_vector(): loss (with each loss part
        beside it), accuracy per slot and tau_uniform (1 + mean accepted prefix over the
        sampled anchors: uniform anchors, so it overestimates decoding's acceptance;
        tau_sim replays decoding)."""
        sums = cls.unpack(vector, block_size)
        correct, counted = sums["correct"], sums["counted"]
        blocks = sums["block_count"]
        weight_sum = max(sums["weight_sum"], 1e-12)
        return {
            "loss": sums["loss_sum"] / weight_sum,
            **{metric: sums[name] / weight_sum for name, metric in cls.loss_parts().items()},
            "weight_sum": sums["weight_sum"],
            "accuracy": sum(correct) / max(sum(counted), 1.0),
            "accuracy_per_slot": [c / max(n, 1.0) for c, n in zip(correct, counted, strict=True)],
            "tau_uniform": 1.0 + sums["accepted_sum"] / max(blocks, 1.0),
            "blocks": blocks,
            "scored_labels": sum(counted),
        }

    @classmethod
    def step_metrics(cls, summary: dict[str, float | list[float]]) -> dict[str, object]:
        """What a training step's record (trainer/step_record.py's StepRecord) reports of
        `summary` (summarise's metrics), by the record's field names: STEP_METRICS, and
        the loss parts by metric name."""
        parts = {metric: summary[metric] for metric in cls.loss_parts().values()}
        return {key: summary[metric] for key, metric in STEP_METRICS.items()} | {
            "loss_parts": parts
        }
