"""A drafter's block proposals drawn at a temperature, with the distributions behind them.

Speculative sampling (ringtrain.eval.sampling) needs, for each drafted token, the
distribution q it was drawn from. Each architecture draws as its greedy proposal rule
picks (its model's ``propose``):

- DFlash: every block slot's tokens from softmax(slot logits / T) within top-p; the
  slots are drawn independently of each other (they see the same masked block).
- DFlash2: the path selector's walk, each step drawing among the slot's top-k candidates
  from softmax(selector scores / T) within top-p after the token drawn before it; q of
  that slot is this distribution over the candidates (zero elsewhere).

The exponential noise of the draws is an input, so the whole proposal has fixed shapes
and no host sync and can be replayed as a CUDA graph (ringtrain.eval.graphed_drafts).
"""

from __future__ import annotations

import torch
from torch import nn

from ringtrain.drafter import FrozenHead
from ringtrain.eval.sampling import race
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
    selector = getattr(model, "candidate_selector", None)  # DFlash2's path selector
    if selector is not None:
        return _sampled_walk(selector, hidden[1:], logits, block[0], sampler, noise)
    q = sampler.probabilities(logits)
    return race(q, noise), q


def _sampled_walk(
    selector: nn.Module,
    hidden: torch.Tensor,
    logits: torch.Tensor,
    anchor: torch.Tensor,
    sampler: TokenSampler,
    noise: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The path selector's walk (DFlash2's CandidateSelector.walk) with each step drawn
    among the slot's top-k candidates, not argmaxed."""
    unary, candidates = logits.topk(selector.top_k, dim=-1)
    q = torch.zeros_like(logits, dtype=torch.float32)
    predecessor = anchor.reshape(1)
    path = []
    for slot in range(hidden.shape[0]):
        row = slice(slot, slot + 1)
        scores = selector.scores(hidden[row], unary[row], candidates[row], predecessor)
        local = sampler.probabilities(scores)
        choice = race(local, noise[row, : selector.top_k])
        predecessor = candidates[row].gather(-1, choice[:, None])[:, 0]
        q[row] = q[row].scatter(-1, candidates[row], local)
        path.append(predecessor)
    return torch.cat(path), q
