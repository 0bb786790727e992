"""Temperature and top-p (nucleus) sampling of next tokens, seeded, for batched generation.

Batched generation (``ringtrain.generate.greedy``, ``batch_decode``) takes the greedy
token unless it is given a ``TokenSampler``, which draws every row's next token from
its softmax at ``temperature``, restricted to the smallest set of most likely tokens
whose probability reaches ``top_p``. Draws come from the sampler's own
``torch.Generator`` (on the model's device), so a run is repeatable from its seed and
nothing else's random state is touched; on CUDA the generator is registered with the
decode step's CUDA graph, so every replay draws fresh numbers.

A draw is the exponential race (argmax of p / E with E ~ Exp(1) independent per token),
which picks token i with probability p_i and, unlike ``torch.multinomial``, never
synchronises with the host: it can be captured in a CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SEED_BOUND = 1 << 62


def race(weights: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """The index drawn from each row of ``weights`` [..., V] (non-negative, not
    necessarily normalised) by the exponential race: argmax(weights / E) with E ~ Exp(1)
    given as ``noise``. Index i wins with probability weights_i / sum(weights); no host
    sync, so a CUDA graph can hold it."""
    return (weights / noise).argmax(dim=-1)


def draw(weights: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """``race`` with fresh exponential noise from ``generator``."""
    return race(weights, torch.empty_like(weights).exponential_(generator=generator))


@dataclass
class TokenSampler:
    """Draws next tokens at ``temperature`` (> 0) from the top-``top_p`` probability mass."""

    temperature: float
    top_p: float
    generator: torch.Generator

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError(f"temperature must be above 0 to sample, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @classmethod
    def seeded(
        cls, temperature: float, top_p: float, seed: int, device: torch.device | str
    ) -> TokenSampler:
        """A sampler whose generator lives on ``device`` and starts from ``seed``."""
        generator = torch.Generator(device=torch.device(device))
        generator.manual_seed(seed)
        return cls(temperature, top_p, generator)

    def probabilities(self, logits: torch.Tensor) -> torch.Tensor:
        """The distribution [B, V] tokens are drawn from: softmax(logits / T), the tail
        beyond ``top_p`` set to zero and the rest renormalised."""
        probs = torch.softmax(logits.float() / self.temperature, dim=-1)
        if self.top_p >= 1:
            return probs
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # A token stays when the mass of the more likely tokens is still below top_p (so
        # the most likely token always stays).
        outside = (sorted_probs.cumsum(dim=-1) - sorted_probs) >= self.top_p
        sorted_probs = sorted_probs.masked_fill(outside, 0.0)
        kept = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
        return kept / kept.sum(dim=-1, keepdim=True)

    def sample(self, logits: torch.Tensor) -> torch.Tensor:
        """One drawn token id per row of ``logits`` [B, V]."""
        return draw(self.probabilities(logits), self.generator)

    def fork_seed(self) -> int:
        """A seed drawn from this sampler's generator (for generators it cannot drive,
        such as transformers' ``generate``, which reads the global one)."""
        device = self.generator.device
        drawn = torch.randint(SEED_BOUND, (1,), generator=self.generator, device=device)
        return int(drawn.item())


def next_tokens(logits: torch.Tensor, sampler: TokenSampler | None) -> torch.Tensor:
    """Each row's next token of ``logits`` [B, V]: the most likely, or ``sampler``'s draw."""
    return logits.argmax(dim=-1) if sampler is None else sampler.sample(logits)
