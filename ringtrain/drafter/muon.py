"""Muon and AdamW stepping one model together, as one torch optimiser.

torch.optim.Muon takes only 2-D matrices and is meant for hidden layers, so a model is
split between it and AdamW (drafter/optim.py decides the split). `MuonAdamW` joins the
two: its param_groups are the two optimisers' groups (the same dicts, so a scheduler
that sets a group's lr sets it for the part stepping that group), one state dict serves
both (their parameters are disjoint), and step() steps both. Its state_dict is therefore
an ordinary optimiser state dict, which a checkpoint saves and loads like AdamW's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


class MuonAdamW(torch.optim.Optimizer):
    """`muon` and `adamw` (over disjoint parameters) as one optimiser; see the module docstring."""

    def __init__(self, muon: torch.optim.Muon, adamw: torch.optim.AdamW) -> None:
        self.parts = (muon, adamw)
        super().__init__([*muon.param_groups, *adamw.param_groups], defaults={})
        self._share_groups_and_state()

    def _share_groups_and_state(self) -> None:
        """Point each part at its slice of this optimiser's groups and at its state."""
        start = 0
        for part in self.parts:
            count = len(part.param_groups)
            part.param_groups = self.param_groups[start : start + count]
            part.state = self.state
            start += count

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load as any optimiser does (which replaces the groups and the state), then share
        them with the parts again."""
        super().load_state_dict(state_dict)
        self._share_groups_and_state()

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> None:  # type: ignore[override]
        """One step of both parts (no closure: each part would evaluate it again)."""
        if closure is not None:
            raise ValueError("MuonAdamW.step takes no closure")
        for part in self.parts:
            part.step()
