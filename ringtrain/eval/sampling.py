"""The speculative sampling rule: which drafted tokens a target keeps when it samples.

At a temperature the drafter draws each block's tokens from its own distribution q (at
the target's temperature and top-p) and the target scores the block once, giving its
distribution p after every block position. Drafted token x at block position k is kept
with probability min(1, p_k(x) / q_k(x)); at the first rejection the next token is drawn
from the residual normalise(max(0, p_k - q_k)) and the block ends; when every draft is
kept the next token (the bonus) is drawn from p after the last draft. Each committed
token is then distributed exactly as the target's own sampling would draw it (Leviathan
et al., 2023; Chen et al., 2023): speculation changes the speed, not the distribution.

``speculative_acceptance`` is that rule as a pure function of (p, q, drafts, random
generator) over any leading batch dimensions, so a test can run it on many synthetic
blocks at once, and decoding can be run with another rule (``AcceptanceRule``) to show
that a wrong one is caught.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ringtrain.generate.sampling import draw

# (p [..., B, V], q [..., B-1, V], drafts [..., B-1], generator) -> (kept drafts [...],
# the next token [...]).
AcceptanceRule = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Generator], tuple[torch.Tensor, torch.Tensor]
]


def speculative_acceptance(
    p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """The kept drafts and the next token of each block (module docstring).

    ``p`` [..., B, V]: the target's distribution after each of the B block positions
    (anchor, draft 1, ..., draft B-1); ``q`` [..., B-1, V]: the distributions drafts
    [..., B-1] were drawn from. Returns (number of drafts kept [...], the token after
    them [...]).
    """
    drafted = drafts.unsqueeze(-1)
    p_drafted = p[..., :-1, :].gather(-1, drafted).squeeze(-1)
    q_drafted = q.gather(-1, drafted).squeeze(-1)
    uniforms = torch.rand(p_drafted.shape, generator=generator, device=p.device)
    kept = uniforms * q_drafted < p_drafted  # probability min(1, p / q)
    accepted = kept.long().cumprod(dim=-1).sum(dim=-1)
    at = accepted[..., None, None].expand(*accepted.shape, 1, p.shape[-1])
    p_next = p.gather(-2, at).squeeze(-2)
    # After the last draft (all kept) q is zero: the residual is p itself, the bonus.
    q_next = torch.cat((q, torch.zeros_like(q[..., :1, :])), dim=-2).gather(-2, at).squeeze(-2)
    residual = (p_next - q_next).clamp_min(0)
    # p == q leaves no residual, and no rejection either (bar rounding): draw from p.
    residual = torch.where(residual.sum(dim=-1, keepdim=True) > 0, residual, p_next)
    return accepted, draw(residual, generator)
