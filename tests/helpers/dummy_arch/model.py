"""The dummy architecture's network, block term and sums (see __init__.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from ringtrain.drafter.arch.base import Architecture
from ringtrain.drafter.arch.dflash.model import Attend, DFlashDrafter
from ringtrain.drafter.config import DrafterConfig
from ringtrain.drafter.spec import DrafterSpec
from ringtrain.drafter.sums import LOSS_PART, ObjectiveSums

SPREAD_WEIGHT = 1e-3


class DummyDrafter(DFlashDrafter):
    """DFlash whose final hidden states are scaled by a learned gate per channel."""

    def __init__(self, spec: DrafterSpec) -> None:
        super().__init__(spec)
        self.output_gate = nn.Parameter(torch.ones(spec.hidden_size))

    def _run(
        self,
        ctx_features: torch.Tensor,
        ctx_positions: torch.Tensor,
        block_embeds: torch.Tensor,
        block_positions: torch.Tensor,
        attends: Sequence[Attend],
    ) -> torch.Tensor:
        hidden = super()._run(ctx_features, ctx_positions, block_embeds, block_positions, attends)
        return hidden * self.output_gate.to(hidden.dtype)


@dataclass(frozen=True)
class SpreadSums(ObjectiveSums):
    """ObjectiveSums with the spread penalty's part of the loss."""

    spread_loss_sum: torch.Tensor = field(metadata=LOSS_PART)


class SpreadTerm:
    """Each slot's argmax proposes; the weighted mean square of the rows joins the loss."""

    top_k = 1

    def __init__(self, drafter: nn.Module, cfg: DrafterConfig, compile_mode: str | None) -> None:
        self.drafter = drafter

    def __call__(
        self,
        rows: torch.Tensor,
        lm_head: torch.Tensor,
        labels: torch.Tensor,
        row_weights: torch.Tensor,
        candidates: torch.Tensor,
        candidate_logits: torch.Tensor,
        chunk: int,
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """({"spread_loss_sum": ...}, each slot's argmax == its label)."""
        spread = rows.float().pow(2).mean(-1) * row_weights.reshape(-1)
        hits = candidates[:, 0] == labels[:, 1:].reshape(-1)
        return {"spread_loss_sum": SPREAD_WEIGHT * spread.sum()}, hits


ARCHITECTURE = Architecture(
    hf_name="DummyDraftModel", model=DummyDrafter, block_term=SpreadTerm, sums_type=SpreadSums
)
