"""The synthetic dataset's parts: row lengths within their bounds, the motif bank and the
walk through it, the noise, the shared language of a held-out split, the prompt/reply
layout of every row, and the settings refused by name."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from ringtrain.data.synthetic import (
    SYNTHETIC_FILE,
    _conversation_mask,
    _motif_tokens,
    motif_bank,
    synthetic_lengths,
    write_synthetic_dataset,
)


def _columns(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(offsets, input_ids, loss_mask) of a written file, over all its record batches."""
    table = pa.ipc.open_file(pa.memory_map(str(path))).read_all()
    ids, mask = table.column("input_ids").combine_chunks(), table.column("loss_mask")
    mask = mask.combine_chunks()
    lengths = np.array([len(row) for row in ids.to_pylist()])
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    return offsets, ids.flatten().to_numpy(), mask.flatten().to_numpy()


def test_lengths_keep_their_mean_and_stay_within_their_bounds() -> None:
    rng = np.random.default_rng(0)
    lengths = synthetic_lengths(rng, 20_000, mean_len=200, sigma=0.6, min_len=1, max_len=10**6)
    assert abs(lengths.mean() - 200) < 5  # the log-normal's mean is mean_len itself
    clipped = synthetic_lengths(rng, 2_000, mean_len=200, sigma=0.6, min_len=150, max_len=260)
    assert clipped.min() == 150 and clipped.max() == 260


def test_the_default_bank_is_half_the_vocabulary_at_most_4096_motifs() -> None:
    rng = np.random.default_rng(0)
    assert motif_bank(rng, 100, 12).shape == (50, 12)
    assert motif_bank(rng, 20_000, 12).shape == (4096, 12)
    assert motif_bank(rng, 100, 12, num_motifs=7).shape == (7, 12)
    assert motif_bank(rng, 3, 12).shape == (2, 12)  # never fewer than two motifs


def test_a_bank_that_fits_the_vocabulary_uses_every_token_once() -> None:
    bank = motif_bank(np.random.default_rng(1), 24, 12, num_motifs=2)
    assert sorted(bank.reshape(-1).tolist()) == list(range(24))
    larger = motif_bank(np.random.default_rng(1), 23, 12, num_motifs=2)
    assert larger.max() < 23 and len(set(larger.reshape(-1).tolist())) < 24


def _motif_steps(tokens: np.ndarray, bank: np.ndarray) -> np.ndarray:
    """The motif index of every whole motif in `tokens` (each bank token is unique)."""
    where = {int(t): i for i, t in enumerate(bank.reshape(-1))}
    motif_len = bank.shape[1]
    whole = len(tokens) // motif_len * motif_len
    first = np.array([where[int(t)] for t in tokens[:whole:motif_len]])
    assert np.all(first % motif_len == 0)  # the walk goes motif by motif
    return first // motif_len


def test_without_jumps_the_walk_goes_to_the_next_motif_and_wraps() -> None:
    bank = motif_bank(np.random.default_rng(0), 100, 10, num_motifs=5)
    tokens = _motif_tokens(np.random.default_rng(3), 10 * 12 + 7, bank, jump_prob=0.0)
    assert len(tokens) == 127  # the last motif cut to the total
    steps = _motif_steps(tokens, bank)
    np.testing.assert_array_equal(steps, (steps[0] + np.arange(12)) % 5)
    np.testing.assert_array_equal(tokens[120:], bank[(steps[0] + 12) % 5][:7])
    walks = [_motif_tokens(np.random.default_rng(seed), 10, bank, 0.0) for seed in range(20)]
    starts = {int(_motif_steps(walk, bank)[0]) for walk in walks}
    assert len(starts) > 1  # the walk starts at a random motif


def test_jumps_leave_the_chain_at_their_rate() -> None:
    bank = motif_bank(np.random.default_rng(0), 1000, 10, num_motifs=50)
    tokens = _motif_tokens(np.random.default_rng(4), 10 * 4000, bank, jump_prob=0.5)
    steps = _motif_steps(tokens, bank)
    off_chain = np.mean(np.diff(steps) % 50 != 1)
    assert 0.45 < off_chain < 0.52  # half the steps jump, 1 in 50 of them to the next motif


def _bank_share(path: Path, bank: np.ndarray) -> float:
    _, ids, _ = _columns(path)
    return float(np.isin(ids, bank).mean())


def test_noise_replaces_its_share_of_tokens(tmp_path: Path) -> None:
    settings = {"rows": 200, "vocab_size": 5000, "mean_len": 100, "num_motifs": 10}
    bank = motif_bank(np.random.default_rng(7), 5000, 12, 10)
    clean = write_synthetic_dataset(tmp_path / "clean", seed=7, noise=0.0, **settings)
    assert _bank_share(clean, bank) == 1.0
    noisy = write_synthetic_dataset(tmp_path / "noisy", seed=7, noise=0.2, **settings)
    assert 0.78 < _bank_share(noisy, bank) < 0.84  # 20% drawn anew, 2% of them in the bank


def test_a_held_out_split_with_the_bank_seed_speaks_the_same_language(tmp_path: Path) -> None:
    settings = {"rows": 50, "vocab_size": 5000, "mean_len": 100, "num_motifs": 10, "noise": 0.0}
    train = write_synthetic_dataset(tmp_path / "train", seed=1, **settings)
    held_out = write_synthetic_dataset(tmp_path / "eval", seed=2, bank_seed=1, **settings)
    other = write_synthetic_dataset(tmp_path / "other", seed=2, **settings)
    assert train.name == SYNTHETIC_FILE
    language = set(_columns(train)[1].tolist())
    assert set(_columns(held_out)[1].tolist()) == language
    assert set(_columns(other)[1].tolist()) != language  # without it: a language of its own
    assert _columns(held_out)[0].tolist() != _columns(train)[0].tolist()  # other rows


def _runs(mask: np.ndarray) -> list[int]:
    """The lengths of the runs of equal values in a row's mask, from its first token."""
    edges = np.flatnonzero(np.diff(mask.astype(np.int8))) + 1
    return np.diff(np.concatenate([[0], edges, [len(mask)]])).tolist()


def test_every_row_is_a_prompt_and_its_reply_a_third_with_a_second_turn() -> None:
    rng = np.random.default_rng(5)
    lengths = rng.integers(100, 400, size=900)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    mask = _conversation_mask(rng, offsets)
    two_turns = 0
    for start, end in itertools.pairwise(offsets):
        row = mask[start:end]
        runs = _runs(row)
        assert row[0] == 0 and len(runs) in (2, 4), runs
        prompt, reply = runs[0], len(row) - runs[0]
        assert len(row) // 10 <= prompt <= 0.35 * len(row)  # 10% to 35% of the row
        if len(runs) == 4:  # the reply split: its first half, a prompt of an eighth, the rest
            two_turns += 1
            assert runs[1:3] == [reply // 2, reply // 8]
    assert 0.28 < two_turns / len(lengths) < 0.39


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"rows": 0}, "rows=0"),
        ({"vocab_size": 1}, "vocab_size=1"),
        ({"min_len": 0}, "min_len=0"),
        ({"min_len": 120}, "min_len=120, mean_len=100"),
        ({"max_len": 90}, "mean_len=100, max_len=90"),
    ],
)
def test_settings_that_make_no_dataset_are_refused_by_name(
    tmp_path: Path, settings: dict, named: str
) -> None:
    given = {"rows": 10, "vocab_size": 100, "mean_len": 100, "seed": 0, "min_len": 64} | settings
    with pytest.raises(ValueError, match=named):
        write_synthetic_dataset(tmp_path, **given)
    assert not (tmp_path / SYNTHETIC_FILE).exists()
