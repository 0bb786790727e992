"""Random packed batches in the ring's payload layout: what a drafter compiles on before
its first batch (trainer/drafter_loop.py), and the drafter benchmarks' and tests' input.

The tensors look like one ring slot: packed documents, per-document position_ids,
cu_seqlens, a loss_mask with an unsupervised prompt at the start of every document.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PackedBatch:
    """One packed batch, laid out like a ring slot's payload."""

    hidden: torch.Tensor  # [N, K*H]
    input_ids: torch.Tensor  # [N] int32
    loss_mask: torch.Tensor  # [N] uint8
    position_ids: torch.Tensor  # [N] int32
    cu_seqlens: torch.Tensor  # [D + 1] int32
    num_tokens: int
    num_docs: int

    def doc_bounds(self, row: int) -> tuple[int, int]:
        """[start, end) of the document holding packed row `row`."""
        bounds = self.cu_seqlens.tolist()
        for start, end in itertools.pairwise(bounds):
            if start <= row < end:
                return start, end
        raise IndexError(f"row {row} is outside the batch's {bounds[-1]} tokens")


def random_packed_batch(
    doc_lens: list[int],
    features: int,
    vocab_size: int,
    device: torch.device | str,
    dtype: torch.dtype,
    seed: int,
    prompt_fraction: float = 0.25,
    mask_holes: int = 0,
) -> PackedBatch:
    """Documents of the given lengths with random tokens and hidden states.

    The first prompt_fraction of every document is unsupervised (loss_mask 0), and
    mask_holes random single positions are unsupervised as well.
    """
    gen = torch.Generator(device="cpu").manual_seed(seed)
    device_gen = torch.Generator(device=device).manual_seed(seed)
    total = sum(doc_lens)
    bounds = torch.tensor([0, *doc_lens]).cumsum(0)
    positions = torch.cat([torch.arange(n) for n in doc_lens])
    prompt = torch.cat([torch.full((n,), int(prompt_fraction * n)) for n in doc_lens])
    loss_mask = (positions >= prompt).to(torch.uint8)
    if mask_holes:
        loss_mask[torch.randint(0, total, (mask_holes,), generator=gen)] = 0
    return PackedBatch(
        hidden=torch.randn(
            total, features, generator=device_gen, device=device, dtype=torch.float32
        ).to(dtype),
        input_ids=torch.randint(0, vocab_size, (total,), generator=gen).to(device, torch.int32),
        loss_mask=loss_mask.to(device),
        position_ids=positions.to(device, torch.int32),
        cu_seqlens=bounds.to(device, torch.int32),
        num_tokens=total,
        num_docs=len(doc_lens),
    )
