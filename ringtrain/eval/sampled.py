"""Speculative decoding at a temperature, and its baseline: the target sampling alone.

Each block: the drafter draws B-1 tokens from its distributions q (at the sampler's
temperature and top-p), the target scores the block in one forward, giving p at every
block position (same temperature and top-p), and the acceptance rule
(ringtrain.eval.sampling) keeps a prefix of the drafts and draws the token after it. The
committed tokens are distributed as the target's own sampling draws them; they are not
compared token for token with anything (two draws of one distribution differ), so at a
temperature the evaluation reports acceptance and speed, and the rule's losslessness
rests on its statistical test.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from ringtrain.eval.sampling import AcceptanceRule, speculative_acceptance
from ringtrain.eval.speculative import Generation, decode_blocks, plain_generate
from ringtrain.eval.target import VerifyingTarget
from ringtrain.generate.sampling import TokenSampler


class SamplingDrafter(Protocol):
    """What speculative decoding at a temperature needs from a drafter."""

    block_size: int
    mask_token_id: int

    def propose_sampled(
        self, context: torch.Tensor, block: torch.Tensor, start: int, sampler: TokenSampler
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(drafts [B-1] drawn at the sampler's settings with its generator, the
        distributions [B-1, V] they were drawn from); arguments as BlockDrafter.propose."""
        ...


@dataclass
class SampledSteps:
    """Blocks drawn by the drafter and judged by ``acceptance`` (a BlockSteps)."""

    drafter: SamplingDrafter
    sampler: TokenSampler
    acceptance: AcceptanceRule = speculative_acceptance

    @property
    def block_size(self) -> int:
        return self.drafter.block_size

    @property
    def mask_token_id(self) -> int:
        return self.drafter.mask_token_id

    def first(
        self, target: VerifyingTarget, prompt: torch.Tensor, features: torch.Tensor
    ) -> torch.Tensor:
        return self.sampler.sample(target.prefill_logits(prompt, features)[None])[0]

    def step(
        self,
        target: VerifyingTarget,
        sequence: torch.Tensor,
        features: torch.Tensor,
        block: torch.Tensor,
        committed: int,
    ) -> list[int]:
        size = self.block_size
        block[0] = sequence[committed]
        drafts, q = self.drafter.propose_sampled(
            features[:committed], block, committed, self.sampler
        )
        sequence[committed + 1 : committed + size] = drafts
        logits = target.verify_logits(
            sequence, committed, size, features[committed : committed + size]
        )
        p = self.sampler.probabilities(logits)
        accepted, token = self.acceptance(p, q, drafts, self.sampler.generator)
        # The step's only host sync: the drafts, how many are kept and the next token.
        host = torch.cat((drafts, accepted.reshape(1), token.reshape(1))).tolist()
        count = host[-2]
        sequence[committed + count + 1] = token
        return [*host[:count], host[-1]]


def sampled_speculative_generate(
    target: VerifyingTarget,
    drafter: SamplingDrafter,
    prompt_ids: torch.Tensor,
    max_new_tokens: int,
    sampler: TokenSampler,
    stop_ids: Sequence[int] = (),
    acceptance: AcceptanceRule = speculative_acceptance,
) -> Generation:
    """Decode ``prompt_ids`` [n] at the ``sampler``'s settings with speculation, blocks
    judged by ``acceptance`` (the speculative sampling rule unless a test gives another)."""
    steps = SampledSteps(drafter, sampler, acceptance)
    return decode_blocks(target, steps, prompt_ids, max_new_tokens, stop_ids)


def sampled_generate(
    target: VerifyingTarget,
    prompt_ids: torch.Tensor,
    max_new_tokens: int,
    sampler: TokenSampler,
    stop_ids: Sequence[int] = (),
) -> Generation:
    """The target sampling alone at the ``sampler``'s settings, one token per forward:
    the distribution speculative sampling must keep, and the baseline of its speed."""

    def pick(logits: torch.Tensor) -> torch.Tensor:
        return sampler.sample(logits[None])[0]

    return plain_generate(target, prompt_ids, max_new_tokens, stop_ids, pick)
