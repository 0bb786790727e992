"""Speculative decoding at a temperature and its baseline stop at an end-of-sequence token
and draw every token from the sampler's own seeded generator."""

from __future__ import annotations

from itertools import accumulate
from pathlib import Path

import pytest
import torch

from ringtrain.eval.sampled import sampled_generate, sampled_speculative_generate
from ringtrain.eval.speculative import Generation
from ringtrain.eval.target import load_verifying_target
from ringtrain.generate.sampling import TokenSampler, draw
from ringtrain.target.tiny import build_tiny_target

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPT = torch.tensor([5, 17, 99, 3, 250, 41])
NEW_TOKENS = 16


class UniformDrafter:
    """Draws every draft uniformly from the vocabulary (mostly rejected, sometimes kept)."""

    def __init__(self, vocab_size: int, block_size: int = 4) -> None:
        self.block_size = block_size
        self.mask_token_id = vocab_size - 1
        self.q = torch.full((block_size - 1, vocab_size), 1.0 / vocab_size)

    def propose_sampled(self, context, block, start, sampler) -> tuple:
        return draw(self.q, sampler.generator), self.q


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_target(
        tmp_path_factory.mktemp("target"), seed=3, hybrid=False, num_layers=2, hidden_size=32,
        vocab_size=300,
    )  # fmt: skip


def _sampler(seed: int) -> TokenSampler:
    return TokenSampler.seeded(1.0, 1.0, seed, "cpu")


def _stop_at_a_later_token(tokens: list[int]) -> tuple[int, list[int]]:
    """(a token first drawn after the first few, the tokens up to and including it)."""
    for k, token in enumerate(tokens):
        if k >= 3 and token not in tokens[:k]:
            return token, tokens[: k + 1]
    raise AssertionError(f"no new token after the third in {tokens}")


def test_speculative_sampling_is_reproducible_and_stops_at_a_stop_token(
    target_dir: Path,
) -> None:
    """Decoding ends with the block that commits the stop token: the same draws as without
    it up to there, and no block after it counted in the acceptance."""
    target = load_verifying_target(target_dir, [0])
    drafter = UniformDrafter(target.vocab_size)

    def decode(stops: list[int] = []) -> Generation:  # noqa: B006 (never changed)
        return sampled_speculative_generate(
            target, drafter, PROMPT, NEW_TOKENS, _sampler(11), stop_ids=stops
        )

    full = decode()
    assert len(full.tokens) == NEW_TOKENS
    assert decode().tokens == full.tokens, "one seed draws one sequence"
    stop, expected = _stop_at_a_later_token(full.tokens)
    stopped = decode([stop])
    assert stopped.tokens == expected
    # The prefill commits the first token, each block its kept drafts and one drawn token.
    ends = list(accumulate((count + 1 for count in full.accepted), initial=1))
    blocks = next(b for b, end in enumerate(ends) if end >= len(expected))
    assert stopped.accepted == full.accepted[:blocks]


@pytest.mark.parametrize("mode", ["own", "cache"])
def test_the_baseline_is_reproducible_and_stops_at_a_stop_token(
    target_dir: Path, mode: str
) -> None:
    target = load_verifying_target(target_dir, [0], mode=mode)
    tokens = sampled_generate(target, PROMPT, NEW_TOKENS, _sampler(12)).tokens
    assert len(tokens) == NEW_TOKENS
    assert sampled_generate(target, PROMPT, NEW_TOKENS, _sampler(12)).tokens == tokens
    stop, expected = _stop_at_a_later_token(tokens)
    assert sampled_generate(target, PROMPT, NEW_TOKENS, _sampler(12), [stop]).tokens == expected
