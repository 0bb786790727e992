"""The decoder's one-token attention (both kernels) against plain SDPA over repeated KV heads."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ringtrain.generate.batch_decode import KERNELS, one_token_attention

# SmolLM2-135M's heads: 9 query heads share 3 key/value heads of 64.
HEADS, KV_HEADS, DIM, LENGTH = 9, 3, 64, 40

DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
        ],
    ),
]


def _reference(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    keep: torch.Tensor | None,
    scale: float,
) -> torch.Tensor:
    """Each query head over its own copy of its key/value head, as [B, 1, H, D]."""
    repeat = HEADS // KV_HEADS
    key, value = key.repeat_interleave(repeat, 1), value.repeat_interleave(repeat, 1)
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=keep, scale=scale)
    return out.transpose(1, 2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("masked", [False, True])
def test_one_token_attention_equals_sdpa_over_repeated_heads(
    device: str, kernel: str, masked: bool
) -> None:
    generator = torch.Generator().manual_seed(3)
    query, key, value = (
        torch.randn(shape, generator=generator).to(device)
        for shape in ((2, HEADS, 1, DIM), (2, KV_HEADS, LENGTH, DIM), (2, KV_HEADS, LENGTH, DIM))
    )
    keep = None
    if masked:
        keep = torch.ones(2, 1, 1, LENGTH, dtype=torch.bool, device=device)
        keep[0, ..., 25:] = False
    out = one_token_attention(query, key, value, keep, DIM**-0.5, kernel)
    assert out.shape == (2, 1, HEADS, DIM)
    expected = _reference(query, key, value, keep, DIM**-0.5)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
