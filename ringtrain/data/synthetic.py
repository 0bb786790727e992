"""A synthetic, learnable token dataset for the embedded default run, tests and benchmarks.

Token streams are built from a bank of random *motifs* (fixed token sequences of
`motif_len` tokens). A document walks through the bank: after motif m usually comes
motif m + 1 (a Markov chain over motifs), sometimes a random jump; a small fraction of
tokens is replaced by noise. Inside a motif every token is determined by the previous
ones, and the walk makes the next motif predictable too, so a drafter can learn to
predict whole blocks, while jumps and noise keep the task from being trivial.

Row lengths follow a log-normal distribution (median about `mean_len * exp(-sigma^2/2)`),
like chat data: many medium rows, a long tail. Each row looks like a conversation: a
user prompt (loss_mask 0) followed by an assistant reply (loss_mask 1); a third of the
rows have a second user/assistant turn. Everything is vectorised numpy.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ringtrain.data.writer import TokenFileWriter

SYNTHETIC_FILE = "synthetic-00000.arrow"


def synthetic_lengths(
    rng: np.random.Generator, rows: int, mean_len: int, sigma: float, min_len: int, max_len: int
) -> np.ndarray:
    """Log-normal row lengths with the given mean, clipped to [min_len, max_len]."""
    mu = np.log(mean_len) - sigma**2 / 2
    lengths = np.rint(rng.lognormal(mu, sigma, rows)).astype(np.int64)
    return np.clip(lengths, min_len, max_len)


def motif_bank(
    rng: np.random.Generator, vocab_size: int, motif_len: int, num_motifs: int = 0
) -> np.ndarray:
    """The [motifs, motif_len] token bank (num_motifs 0: vocab_size // 2, at most 4096).

    When the bank fits in the vocabulary every token gets one place in it, so each token
    determines the next one (a fast-to-learn language); otherwise tokens repeat."""
    count = num_motifs or max(2, min(4096, vocab_size // 2))
    if count * motif_len <= vocab_size:
        unique = rng.permutation(vocab_size)[: count * motif_len]
        return unique.astype(np.int32).reshape(count, motif_len)
    return rng.integers(0, vocab_size, size=(count, motif_len), dtype=np.int32)


def _motif_tokens(
    rng: np.random.Generator, total: int, bank: np.ndarray, jump_prob: float
) -> np.ndarray:
    """`total` tokens of a random walk through a bank of motifs."""
    num_motifs, motif_len = bank.shape
    steps = -(-total // motif_len)
    increments = np.ones(steps, dtype=np.int64)
    jumps = rng.random(steps) < jump_prob
    increments[jumps] = rng.integers(0, num_motifs, size=int(jumps.sum()))
    increments[0] = rng.integers(0, num_motifs)
    walk = np.cumsum(increments) % num_motifs
    return bank[walk].reshape(-1)[:total]


def _conversation_mask(rng: np.random.Generator, offsets: np.ndarray) -> np.ndarray:
    """Loss mask with one or two (prompt 0, reply 1) turns per row."""
    starts, lengths = offsets[:-1], np.diff(offsets)
    rows = len(lengths)
    total = int(offsets[-1])
    # Each row: [prompt | reply] or [prompt | reply | prompt2 | reply2].
    prompt_end = starts + (lengths * rng.uniform(0.1, 0.35, rows)).astype(np.int64)
    delta = np.zeros(total + 1, dtype=np.int8)
    np.add.at(delta, prompt_end, 1)
    np.add.at(delta, starts + lengths, -1)
    two_turns = np.flatnonzero(rng.random(rows) < 1 / 3)
    reply_len = starts[two_turns] + lengths[two_turns] - prompt_end[two_turns]
    second_prompt = prompt_end[two_turns] + reply_len // 2
    second_reply = second_prompt + reply_len // 8
    np.add.at(delta, second_prompt, -1)
    np.add.at(delta, second_reply, 1)
    return np.cumsum(delta[:-1], dtype=np.int8).view(np.uint8)


def write_synthetic_dataset(
    directory: str | Path,
    rows: int,
    vocab_size: int,
    mean_len: int,
    seed: int,
    *,
    sigma: float = 0.6,
    min_len: int = 64,
    max_len: int = 8192,
    motif_len: int = 12,
    jump_prob: float = 0.05,
    noise: float = 0.02,
    num_motifs: int = 0,
    bank_seed: int | None = None,
) -> Path:
    """Write a learnable synthetic dataset into `directory` (created); return its file.

    `rows` rows with log-normal lengths of mean `mean_len` (shape `sigma`, clipped to
    [min_len, max_len]), token ids below `vocab_size`; deterministic for a `seed`.
    The motif bank (the "language") comes from `bank_seed` (default: `seed`), so a
    held-out split with another `seed` and the same `bank_seed` speaks the same language.
    """
    if rows < 1 or vocab_size < 2 or not 1 <= min_len <= mean_len <= max_len:
        raise ValueError(
            "write_synthetic_dataset needs rows >= 1, vocab_size >= 2 and "
            f"min_len <= mean_len <= max_len (got rows={rows}, vocab_size={vocab_size}, "
            f"min_len={min_len}, mean_len={mean_len}, max_len={max_len})"
        )
    rng = np.random.default_rng(seed)
    lengths = synthetic_lengths(rng, rows, mean_len, sigma, min_len, max_len)
    offsets = np.zeros(rows + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    total = int(offsets[-1])
    bank_rng = np.random.default_rng(seed if bank_seed is None else bank_seed)
    bank = motif_bank(bank_rng, vocab_size, motif_len, num_motifs)
    input_ids = _motif_tokens(rng, total, bank, jump_prob)
    noisy = rng.integers(0, total, size=rng.binomial(total, noise))
    input_ids[noisy] = rng.integers(0, vocab_size, size=len(noisy), dtype=np.int32)
    loss_mask = _conversation_mask(rng, offsets)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    with TokenFileWriter(directory / SYNTHETIC_FILE) as writer:
        writer.write(offsets, input_ids, loss_mask)
    return writer.path
