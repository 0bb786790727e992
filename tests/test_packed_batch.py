"""Random packed batches: ring-slot layout, an unsupervised prompt per document."""

from __future__ import annotations

import pytest
import torch

from ringtrain.packed_batch import random_packed_batch


def test_layout_and_prompt_mask() -> None:
    lengths = [8, 12, 4]
    batch = random_packed_batch(lengths, 6, 50, "cpu", torch.float32, 0, prompt_fraction=0.25)
    assert (batch.num_tokens, batch.num_docs) == (24, 3)
    assert batch.hidden.shape == (24, 6)
    assert batch.cu_seqlens.tolist() == [0, 8, 20, 24]
    assert batch.position_ids.tolist() == [*range(8), *range(12), *range(4)]
    assert batch.loss_mask.tolist() == [0, 0] + [1] * 6 + [0] * 3 + [1] * 9 + [0] + [1] * 3
    assert batch.input_ids.dtype == torch.int32 and batch.loss_mask.dtype == torch.uint8
    assert int(batch.input_ids.min()) >= 0 and int(batch.input_ids.max()) < 50
    assert batch.doc_bounds(8) == (8, 20) and batch.doc_bounds(23) == (20, 24)
    with pytest.raises(IndexError):
        batch.doc_bounds(24)


def test_without_prompt_every_token_is_supervised_and_seeds_repeat() -> None:
    batch = random_packed_batch([5, 7], 4, 50, "cpu", torch.float32, 3, prompt_fraction=0.0)
    assert bool(batch.loss_mask.all())
    again = random_packed_batch([5, 7], 4, 50, "cpu", torch.float32, 3, prompt_fraction=0.0)
    assert torch.equal(batch.input_ids, again.input_ids)
    assert torch.equal(batch.hidden, again.hidden)


def test_mask_holes_unsupervise_single_positions_and_hidden_takes_the_dtype() -> None:
    """Without a prompt, mask_holes=3 leaves between one and three positions unsupervised
    (three draws, which may repeat); the prompt stays unsupervised beside the holes; the
    hidden states come in the dtype asked for."""
    lengths = [6, 10]
    holed = random_packed_batch(lengths, 4, 50, "cpu", torch.float64, 5, 0.0, mask_holes=3)
    assert 1 <= int((holed.loss_mask == 0).sum()) <= 3
    assert holed.hidden.dtype == torch.float64
    prompted = random_packed_batch(lengths, 4, 50, "cpu", torch.float64, 5, 0.5, mask_holes=3)
    prompt = [0, 1, 2, 6, 7, 8, 9, 10]
    assert prompted.loss_mask[prompt].tolist() == [0] * len(prompt)
