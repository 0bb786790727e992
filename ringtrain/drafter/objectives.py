"""The training objectives ([drafter] objective): how a batch's scored labels are weighted.

An objective decides two things (the `Objective` protocol): the row weights handed to
the loss for the scored slots, whose sum is the loss's normaliser (`row_weights`), and
how the loss turns them into the weights it uses from each chunk's own cross-entropy
(`reweight`, detached: the gradient keeps its form). The objectives, by their config name
(`OBJECTIVES`):

- ``decayed_ce`` (the paper's): CE at slot k weighted w_k = exp(-(k - 1) / gamma), k = 1 ..
  B - 1; the normaliser is the sum of the weights of the scored labels.
- ``dpace`` (D-PACE, Dynamic Position-Aware Cross-Entropy): slot k weighted by the
  expected number of slots decoding reaches from k on, computed (without gradient) from
  the drafter's own probabilities of the labels, see ``loss.dpace_weights``; the
  normaliser is the number of scored labels.

A new objective is a class with these members and an entry in `OBJECTIVES` (and its
name among the config's choices, drafter/config.py: ringtrain/choices.py checks both).
"""

from __future__ import annotations

from functools import partial
from typing import Protocol

import torch

from ringtrain.choices import choice_table
from ringtrain.drafter.config import DrafterConfig
from ringtrain.drafter.loss import Reweight, dpace_weights, given_weights

# The paper's loss decay per block size (w_k = exp(-(k-1)/gamma)).
PAPER_GAMMA = {16: 7.0, 10: 5.0, 8: 4.0}


class Objective(Protocol):
    """How the scored labels of a batch are weighted (see the module docstring)."""

    reweight: Reweight  # (CE, row weights) -> the weights the loss uses, per chunk

    def row_weights(self, scored: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Row weights [A, B - 1] for the scored slots [A, B - 1]; their sum normalises."""
        ...


def loss_gamma(cfg: DrafterConfig) -> float:
    """The loss decay gamma: the config's value, else the paper's for the block size."""
    if cfg.gamma > 0:
        return cfg.gamma
    if cfg.block_size not in PAPER_GAMMA:
        raise ValueError(
            f"[drafter] gamma: no paper default for block_size={cfg.block_size} "
            f"(known: {sorted(PAPER_GAMMA)}); set gamma explicitly"
        )
    return PAPER_GAMMA[cfg.block_size]


def slot_weights(cfg: DrafterConfig, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """w_k = exp(-(k - 1) / gamma) for k = 0 .. B - 1 (k = 0 is never scored)."""
    slots = torch.arange(cfg.block_size, device=device, dtype=dtype)
    return torch.exp(-(slots - 1) / loss_gamma(cfg))


class DecayedCE:
    """The paper's cross-entropy: slot k weighted exp(-(k - 1) / gamma)."""

    def __init__(self, cfg: DrafterConfig) -> None:
        self.cfg = cfg
        self.reweight: Reweight = given_weights

    def row_weights(self, scored: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """w_k on the scored slots."""
        return slot_weights(self.cfg, scored.device, dtype)[1:] * scored


class DPace:
    """D-PACE: 1 on the scored slots, turned into expected run lengths by the loss."""

    def __init__(self, cfg: DrafterConfig) -> None:
        self.reweight: Reweight = partial(
            dpace_weights, alpha=cfg.dpace_alpha, slots=cfg.block_size - 1
        )

    def row_weights(self, scored: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """1 on the scored slots (the loss makes the weights)."""
        return scored.to(dtype)


OBJECTIVES: dict[str, type[DecayedCE | DPace]] = choice_table(
    DrafterConfig, "objective", {"decayed_ce": DecayedCE, "dpace": DPace}
)


def objective_of(cfg: DrafterConfig) -> Objective:
    """The objective `cfg.objective` names."""
    return OBJECTIVES[cfg.objective](cfg)
