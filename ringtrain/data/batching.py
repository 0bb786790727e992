"""Deterministic, sharded, token-budget batches: packed for the ring, padded for the target.

Grouping. Every row has a padded length `L = bucket_up(len)`. An epoch shuffles the rows
(seeded by (seed, epoch)), groups them by L (random order inside a group) and cuts each
group into batches of `token_budget // L` rows (the last batch of a group may be
smaller). So every batch holds rows of one padded length L and satisfies
`B * L <= token_budget`, which bounds both the packed token count and the target's
padded [B, L] activations. The padding of a row is only its rounding to the bucket,
`L - len < bucket`, whatever the batch composition, so the padding fraction is about
`bucket / (2 * mean_len)`: with ~1000-token rows a bucket of 128 wastes ~6%, the default
bucket of 32 about 1.6% (and gives max_len / 32 distinct L values, few enough to warm up).
The number of batches per epoch does not depend on the shuffle, so the epoch length is
the same in every epoch.

Sharding. The epoch's batches are shuffled into a global list; batch j of an epoch has
`batch_id = epoch * 10**9 + j`. Target rank r of T takes batches r, r + T, ...; the last
`n % T` batches of each epoch's list are dropped so all ranks get the same count. A
rank's stream is numbered by a local sequence number `seq` (0, 1, 2, ... across epochs,
forever). Resume = start at a sequence number and skip a set of sequence numbers
(batches trained out of order before the checkpoint).

Buffers. A stream owns two sets of output buffers and alternates between them, so the
arrays of a Batch (and of its PaddedBatch) stay valid while the next batch is built and
until the one after it is taken: a consumer may hold the current batch and prepare the
upcoming one. Call `Batch.copy()` to keep a batch longer.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from itertools import pairwise

import numpy as np

from ringtrain.batch import TOKEN_ARRAYS
from ringtrain.data.dataset import TokenDataset
from ringtrain.data.errors import DatasetError
from ringtrain.named_arrays import NamedArrays

BATCH_ID_STRIDE = 10**9


def bucket_up(lengths: np.ndarray | int, bucket: int) -> np.ndarray | int:
    """Round lengths up to a multiple of `bucket`."""
    return -(-lengths // bucket) * bucket


@dataclass(frozen=True)
class PaddedBatch:
    """A batch as right-padded rows [B, L] for the target model.

    `token_index[i]` is the position in the flattened [B * L] array of packed token i,
    so the real rows of a [B, L, H] activation are `act.reshape(B * L, H)[token_index]`.
    """

    input_ids: np.ndarray  # int64 [B, L], pad = 0
    attention_mask: np.ndarray  # int64 [B, L], 1 real, 0 pad
    token_index: np.ndarray  # int64 [N]
    padding_fraction: float  # pad cells / (B * L)


@dataclass
class Batch(NamedArrays):
    """One packed batch: documents back to back, described by cu_seqlens.

    `arrays` holds the token arrays of batch.py's TOKEN_ARRAYS by name (also readable as
    attributes: `batch.input_ids`), N rows each or B + 1 for cu_seqlens."""

    batch_id: int
    epoch: int
    seq: int  # local sequence number in this rank's stream
    arrays: dict[str, np.ndarray]
    _padding: _PaddingBuffers = field(repr=False)

    @property
    def num_tokens(self) -> int:
        """N, the number of real tokens."""
        return len(self.input_ids)

    @property
    def num_docs(self) -> int:
        """B, the number of documents."""
        return len(self.cu_seqlens) - 1

    def padded(self, bucket: int | None = None) -> PaddedBatch:
        """Right-padded [B, L] view, L = max document length rounded up to `bucket`
        (default: the stream's bucket, which keeps B * L within the token budget)."""
        return self._padding.fill(self, bucket)

    def copy(self) -> Batch:
        """A copy that owns its arrays (the stream reuses its buffers)."""
        return Batch(
            batch_id=self.batch_id,
            epoch=self.epoch,
            seq=self.seq,
            arrays={name: array.copy() for name, array in self.arrays.items()},
            _padding=_PaddingBuffers(self._padding.default_bucket, 0),
        )


class _BatchBuffers:
    """One set of reused output arrays for packed batches and their padded views."""

    def __init__(self, token_budget: int, max_docs: int, bucket: int) -> None:
        self.arrays = {
            f.name: np.zeros(token_budget if f.per == "token" else max_docs + 1, dtype=f.dtype)
            for f in TOKEN_ARRAYS
        }
        self.padding = _PaddingBuffers(bucket, token_budget)

    def batch_arrays(self, num_tokens: int, num_docs: int) -> dict[str, np.ndarray]:
        """The rows a batch of `num_tokens` tokens in `num_docs` documents uses."""
        return {
            f.name: self.arrays[f.name][: num_tokens if f.per == "token" else num_docs + 1]
            for f in TOKEN_ARRAYS
        }


class _PaddingBuffers:
    """Reused storage for padded views (grown only if a caller asks for a larger bucket)."""

    def __init__(self, default_bucket: int, capacity: int) -> None:
        self.default_bucket = default_bucket
        self._ids = np.zeros(capacity, dtype=np.int64)
        self._attention = np.zeros(capacity, dtype=np.int64)

    def fill(self, batch: Batch, bucket: int | None) -> PaddedBatch:
        bucket = bucket or self.default_bucket
        cu = batch.cu_seqlens
        docs, tokens = batch.num_docs, batch.num_tokens
        lengths = np.diff(cu)
        width = int(bucket_up(int(lengths.max()), bucket))
        cells = docs * width
        if cells > len(self._ids):
            self._ids = np.zeros(cells, dtype=np.int64)
            self._attention = np.zeros(cells, dtype=np.int64)
        row_shift = np.arange(docs, dtype=np.int64) * width - cu[:-1]
        token_index = np.repeat(row_shift, lengths) + np.arange(tokens, dtype=np.int64)
        ids, attention = self._ids[:cells], self._attention[:cells]
        ids.fill(0)
        attention.fill(0)
        ids[token_index] = batch.input_ids
        attention[token_index] = 1
        return PaddedBatch(
            input_ids=ids.reshape(docs, width),
            attention_mask=attention.reshape(docs, width),
            token_index=token_index,
            padding_fraction=1.0 - tokens / cells,
        )


@dataclass(frozen=True)
class EpochPlan:
    """The global batch list of one epoch: batch j holds rows `rows[bounds[j]:bounds[j+1]]`."""

    rows: np.ndarray  # int64 [num_rows], dataset row indices grouped by batch
    bounds: np.ndarray  # int64 [num_batches + 1]


def plan_epoch(padded_lengths: np.ndarray, token_budget: int, seed: int, epoch: int) -> EpochPlan:
    """Group rows by padded length, cut groups into budget-sized batches, shuffle batches."""
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(padded_lengths))
    order = order[np.argsort(padded_lengths[order], kind="stable")]
    widths, group_first, group_rows = np.unique(
        padded_lengths[order], return_index=True, return_counts=True
    )
    capacity = token_budget // widths
    group_batches = -(-group_rows // capacity)
    rank_in_group = np.arange(len(order)) - np.repeat(group_first, group_rows)
    first_batch = np.concatenate([[0], np.cumsum(group_batches)[:-1]])
    batch_of_row = np.repeat(first_batch, group_rows) + rank_in_group // np.repeat(
        capacity, group_rows
    )
    num_batches = int(group_batches.sum())
    sorted_bounds = np.searchsorted(batch_of_row, np.arange(num_batches + 1))
    shuffle = rng.permutation(num_batches)
    sizes = np.diff(sorted_bounds)[shuffle]
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    gather = np.repeat(sorted_bounds[shuffle] - bounds[:-1], sizes) + np.arange(len(order))
    return EpochPlan(rows=order[gather], bounds=bounds)


def batches_per_epoch(padded_lengths: np.ndarray, token_budget: int) -> int:
    """Number of batches in every epoch (independent of the shuffle)."""
    widths, counts = np.unique(padded_lengths, return_counts=True)
    return int((-(-counts // (token_budget // widths))).sum())


def max_docs_per_batch(ds: TokenDataset, token_budget: int, bucket: int) -> int:
    """The most documents a batch of `ds` can hold: the budget over its shortest padded row."""
    return token_budget // int(bucket_up(ds.min_row_len, bucket))


class BatchStream(Iterator[Batch]):
    """This rank's infinite, deterministic stream of batches (see the module docstring)."""

    def __init__(
        self,
        ds: TokenDataset,
        *,
        token_budget: int,
        bucket: int,
        seed: int,
        rank: int,
        world: int,
        start: int = 0,
        skip: Collection[int] = (),
    ) -> None:
        if bucket < 1 or not 0 <= rank < world:
            raise DatasetError(f"bad stream arguments: bucket={bucket}, rank={rank}, world={world}")
        longest = int(bucket_up(ds.max_row_len, bucket))
        if longest > token_budget:
            raise DatasetError(
                f"{ds.path}: the longest row ({ds.max_row_len} tokens, {longest} padded to the "
                f"bucket of {bucket}) does not fit the token budget of {token_budget}; "
                "raise data.token_budget or lower data.max_len"
            )
        self.dataset = ds
        self.token_budget = token_budget
        self.bucket = bucket
        self.seed = seed
        self.rank = rank
        self.world = world
        self._padded_lengths = bucket_up(ds.row_length, bucket)
        self.batches_per_epoch = batches_per_epoch(self._padded_lengths, token_budget)
        self.batches_per_rank = self.batches_per_epoch // world
        if self.batches_per_rank == 0:
            raise DatasetError(
                f"{ds.path}: {self.batches_per_epoch} batches per epoch cannot feed {world} "
                "target ranks; use more data, a smaller token budget or fewer target ranks"
            )
        self.max_docs = max_docs_per_batch(ds, token_budget, bucket)
        self._next_seq = start
        self._skip = {s for s in skip if s >= start}
        self._plan: EpochPlan | None = None
        self._plan_epoch = -1
        self._buffers = [_BatchBuffers(token_budget, self.max_docs, bucket) for _ in range(2)]
        self._built = 0
        self._arange = np.arange(token_budget, dtype=np.int64)

    def __iter__(self) -> BatchStream:
        return self

    def __next__(self) -> Batch:
        while self._next_seq in self._skip:
            self._skip.discard(self._next_seq)
            self._next_seq += 1
        batch = self.batch_at(self._next_seq)
        self._next_seq += 1
        return batch

    def locate(self, seq: int) -> tuple[int, int]:
        """(epoch, index in the epoch's global batch list) of local sequence number `seq`."""
        epoch, local = divmod(seq, self.batches_per_rank)
        return epoch, self.rank + local * self.world

    def batch_at(self, seq: int) -> Batch:
        """Build the batch with local sequence number `seq` into the stream's buffers."""
        epoch, index = self.locate(seq)
        if epoch != self._plan_epoch:
            self._plan = plan_epoch(self._padded_lengths, self.token_budget, self.seed, epoch)
            self._plan_epoch = epoch
        plan = self._plan
        ds = self.dataset
        rows = plan.rows[plan.bounds[index] : plan.bounds[index + 1]]
        segments = ds.row_segment[rows]
        by_segment = np.argsort(segments, kind="stable")
        rows, segments = rows[by_segment], segments[by_segment]
        lengths = ds.row_length[rows]
        docs = len(rows)
        out = self._buffers[self._built % 2]
        self._built += 1
        tokens = int(lengths.sum())
        arrays = out.batch_arrays(tokens, docs)
        cu = arrays["cu_seqlens"]
        np.cumsum(lengths, out=cu[1:])
        ramp = self._arange[:tokens]
        doc_first = np.repeat(cu[:-1].astype(np.int64), lengths)
        np.subtract(ramp, doc_first, out=arrays["position_ids"], casting="unsafe")
        source = ramp - doc_first
        source += np.repeat(ds.row_start[rows], lengths)
        ids, mask = arrays["input_ids"], arrays["loss_mask"]
        changes = np.flatnonzero(segments[1:] != segments[:-1]) + 1
        doc_bounds = np.concatenate([[0], changes, [docs]])
        for first, last in pairwise(doc_bounds):
            segment = ds.segments[segments[first]]
            span = slice(int(cu[first]), int(cu[last]))
            np.take(segment.input_ids, source[span], out=ids[span])
            np.take(segment.loss_mask, source[span], out=mask[span])
        return Batch(
            batch_id=epoch * BATCH_ID_STRIDE + index,
            epoch=epoch,
            seq=seq,
            arrays=arrays,
            _padding=out.padding,
        )
