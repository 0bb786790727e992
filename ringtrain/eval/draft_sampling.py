"""A drafter's block proposals drawn at a temperature, with the distributions behind them.

Speculative sampling (ringtrain.eval.sampling) needs, for each drafted token, the
distribution q it was drawn from. Each architecture draws as its greedy proposal rule
picks (its model's ``propose``), by its model's ``sampled_proposal`` (DFlash: each slot
independently from its softmax; DFlash2: the path selector's walk, each step drawn).

The exponential noise of the draws is an input, so the whole proposal has fixed shapes
and no host sync and can be replayed as a CUDA graph (ringtrain.eval.graphed_drafts).
"""

from __future__ import annotations

import torch
from torch import nn

from ringtrain.drafter import FrozenHead
from ringtrain.generate.sampling import TokenSampler


def sample_drafts(
    model: nn.Module,
    head: FrozenHead,
    context: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    block: torch.Tensor,
    block_positions: torch.Tensor,
    sampler: TokenSampler,
    noise: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(drafts [B-1], their distributions q [B-1, V]) for block slots 1..B-1.

    ``context``: (features [n, K*H], positions [n], valid rows [n]) as the drafter's
    ``draft_hidden`` takes them; ``block`` [B]: [anchor, MASK...] at ``block_positions``;
    ``sampler``: temperature and top-p (its generator is not used: the draws come from
    ``noise`` [B-1, V], i.i.d. Exp(1)).
    """
    features, positions, valid = context
    hidden = model.draft_hidden(head, features, positions, block, block_positions, valid)
    logits = model.head_logits(head, hidden[1:])
    return model.sampled_proposal(hidden[1:], logits, block[0], sampler, noise)
