"""Synthetic dataset: deterministic, valid, learnable, with assistant-like loss masks."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ringtrain.data import open_dataset, write_synthetic_dataset


def test_deterministic_and_valid(tmp_path: Path) -> None:
    a = write_synthetic_dataset(tmp_path / "a", rows=500, vocab_size=300, mean_len=150, seed=1)
    b = write_synthetic_dataset(tmp_path / "b", rows=500, vocab_size=300, mean_len=150, seed=1)
    c = write_synthetic_dataset(tmp_path / "c", rows=500, vocab_size=300, mean_len=150, seed=2)
    assert a.read_bytes() == b.read_bytes() != c.read_bytes()
    ds = open_dataset(tmp_path / "a", max_len=8192, truncate=False, block_size=16, vocab_size=300)
    assert ds.num_rows == 500 and ds.num_dropped == 0
    assert 0.55 < ds.num_supervised / ds.num_tokens < 0.9
    assert abs(ds.num_tokens / 500 - 150) < 15


def test_tokens_are_predictable_from_context(tmp_path: Path) -> None:
    write_synthetic_dataset(tmp_path, rows=400, vocab_size=2000, mean_len=300, seed=0)
    ds = open_dataset(tmp_path, max_len=8192, truncate=False, block_size=16)
    ids = ds.segments[0].input_ids.astype(np.int64)
    # Predict each token from the two before it with the most frequent continuation.
    context = ids[:-2] * 2000 + ids[1:-1]
    pairs = context * 2000 + ids[2:]
    unique, counts = np.unique(pairs, return_counts=True)
    order = np.lexsort((-counts, unique // 2000))
    first_of_context = np.unique(unique[order] // 2000, return_index=True)[1]
    best = counts[order][first_of_context].sum()
    assert best / len(pairs) > 0.8  # far above chance (1 / 2000)


def test_loss_mask_has_prompt_then_reply(tmp_path: Path) -> None:
    write_synthetic_dataset(tmp_path, rows=300, vocab_size=100, mean_len=200, seed=4)
    ds = open_dataset(tmp_path, max_len=8192, truncate=False, block_size=16)
    seg = ds.segments[0]
    turns = []
    for row in range(ds.num_rows):
        mask = seg.loss_mask[seg.starts[row] : seg.starts[row] + seg.lengths[row]]
        assert mask[0] == 0 and mask[-1] == 1  # starts with a prompt, ends in a reply
        turns.append(int((np.diff(mask.astype(np.int8)) == 1).sum()))
    assert set(turns) == {1, 2}
