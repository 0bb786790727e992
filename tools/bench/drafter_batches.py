"""The packed batches bench_drafter trains on: warm-up batches of the shape's nominal
documents, then measured batches filled as the data pipeline packs them ("packed") and
filled to only part of the budget ("varied"), of 1-6 documents of random lengths or, for
a shape whose documents are bounded (the real-model recipe's data.max_len), as many of
bounded length as fill the batch."""

from __future__ import annotations

import dataclasses

import torch

from ringtrain.drafter.spec import DrafterSpec
from ringtrain.packed_batch import PackedBatch, random_packed_batch

PACKED = (0.97, 1.0)  # batch fill of the data pipeline's packing
VARIED = (0.6, 1.0)
# The shortest document of a batch packed from documents of bounded length.
SHORTEST_DOC = 64


def doc_lengths(
    rng: torch.Generator,
    max_tokens: int,
    nominal: list[int],
    fill: tuple[float, float] | None,
    longest: int = 0,
) -> list[int]:
    """The nominal documents (fill None), or documents filling a random fraction in
    [fill[0], fill[1]] of the batch: 1-6 of random lengths (``longest`` 0), else as many
    of SHORTEST_DOC to ``longest`` tokens (uniform) as it takes, the last one cut."""
    if fill is None:
        return nominal
    if longest:
        share = fill[0] + (fill[1] - fill[0]) * float(torch.rand(1, generator=rng))
        target = int(share * max_tokens)
        shortest, lengths = min(SHORTEST_DOC, longest), []
        while sum(lengths) < target:
            lengths.append(int(torch.randint(shortest, longest + 1, (1,), generator=rng)))
        lengths[-1] -= sum(lengths) - target
        return [n for n in lengths if n >= 2]
    count = int(torch.randint(1, 7, (1,), generator=rng))
    fill = fill[0] + (fill[1] - fill[0]) * float(torch.rand(1, generator=rng))
    cuts = torch.rand(count, generator=rng) + 0.05
    lengths = (cuts / cuts.sum() * fill * max_tokens).long().clamp(min=2)
    return lengths.tolist()


def make_batches(args, spec: DrafterSpec, device: torch.device, dtype: torch.dtype):
    """Warm-up batches (nominal documents), packed and varied-fill measured batches."""
    rng = torch.Generator().manual_seed(0)
    features = spec.num_taps * spec.hidden_size
    shared_hidden = torch.randn(args.max_tokens, features, device=device, dtype=torch.float32)
    shared_hidden = shared_hidden.to(dtype)
    nominal = [args.doc_len] * args.docs

    def batch(seed: int, fill: tuple[float, float] | None) -> PackedBatch:
        lengths = doc_lengths(rng, args.max_tokens, nominal, fill, args.longest)
        meta = random_packed_batch(lengths, 1, spec.vocab_size, device, dtype, seed)
        return dataclasses.replace(meta, hidden=shared_hidden)

    warm = [
        batch(i, VARIED if i > 0 and i == args.warmup - 1 else None) for i in range(args.warmup)
    ]
    packed = [batch(1000 + i, PACKED) for i in range(args.steps)]
    varied = [batch(2000 + i, VARIED) for i in range(args.steps)]
    return warm, packed, varied
