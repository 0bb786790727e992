"""A token dataset ready for batching: flat columns plus a compact table of usable rows.

`open_dataset` reads every file of a dataset directory (see `arrow_files`), validates
it, applies `max_len` (truncate or fail), and drops rows whose (truncated) loss mask
has fewer than `2 * block_size` supervised tokens: such a row cannot hold one training
block of the drafter. Kept rows are described by three arrays (segment, start, length),
so batching never touches per-row Python objects.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from ringtrain.data.arrow_files import Segment, list_data_files, read_segments
from ringtrain.data.errors import DatasetError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TokenDataset:
    """The usable rows of a dataset, as views into memory-mapped token columns.

    `segments[row_segment[i]]` holds kept row i at `row_start[i]` with `row_length[i]`
    tokens (already truncated to `max_len`).
    """

    path: Path
    segments: list[Segment]
    row_segment: np.ndarray  # int32 [rows]
    row_start: np.ndarray  # int64 [rows]
    row_length: np.ndarray  # int64 [rows]
    num_dropped: int  # rows with fewer than 2 * block_size supervised tokens
    num_truncated: int  # kept rows cut to max_len
    num_supervised: int  # loss-mask tokens in the kept (truncated) rows
    tables: list[pa.Table]  # own the memory the segments view

    @property
    def num_rows(self) -> int:
        """Rows available for training."""
        return len(self.row_length)

    @property
    def num_tokens(self) -> int:
        """Tokens in the kept rows (after truncation)."""
        return int(self.row_length.sum())

    @property
    def max_row_len(self) -> int:
        """Length of the longest kept row (after truncation)."""
        return int(self.row_length.max())

    @property
    def min_row_len(self) -> int:
        """Length of the shortest kept row."""
        return int(self.row_length.min())


_EDGE_CHUNK_TOKENS = 1 << 24


def mask_spans(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Starts and ends of the runs of ones in a 0/1 mask, scanned in chunks."""
    edges = [np.zeros(1, dtype=np.int64)] if mask.size and mask[0] else []
    for low in range(0, max(len(mask) - 1, 0), _EDGE_CHUNK_TOKENS):
        high = min(low + _EDGE_CHUNK_TOKENS, len(mask) - 1)
        edges.append(np.flatnonzero(mask[low + 1 : high + 1] != mask[low:high]) + (low + 1))
    if mask.size and mask[-1]:
        edges.append(np.array([len(mask)], dtype=np.int64))
    flat = np.concatenate(edges) if edges else np.zeros(0, dtype=np.int64)
    return flat[0::2], flat[1::2]


def supervised_counts(mask: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Number of ones in `mask[s:s+n]` for every row (s, n) of a 0/1 mask, vectorised.

    The mask is scanned once for its runs of ones (a compare pass, no cast of the whole
    array); a row's count is then the difference of the number of ones before its end and
    before its start, found by binary search over the runs.
    """
    span_starts, span_ends = mask_spans(mask)
    ones_before = np.concatenate([[0], np.cumsum(span_ends - span_starts)])

    def ones_below(position: np.ndarray) -> np.ndarray:
        span = np.searchsorted(span_starts, position, side="right") - 1
        inside = np.minimum(position, span_ends[span]) - span_starts[span]
        return np.where(span >= 0, ones_before[span] + inside, 0)

    if not len(span_starts):
        return np.zeros(len(starts), dtype=np.int64)
    return ones_below(starts + lengths) - ones_below(starts)


def _check_vocab(segment: Segment, vocab_size: int) -> None:
    ids = segment.input_ids
    if not ids.size:
        return
    low, high = int(ids.min()), int(ids.max())
    if low >= 0 and high < vocab_size:
        return
    flat = int(np.flatnonzero((ids < 0) | (ids >= vocab_size))[0])
    row = int(np.searchsorted(segment.starts, flat, side="right")) - 1
    raise DatasetError(
        f"{segment.file}: row {segment.first_row + row}: token id {int(ids[flat])} is outside "
        f"the vocabulary [0, {vocab_size}); the dataset was tokenized for another model, "
        "prepare it again with the target's tokenizer"
    )


def _check_mask_values(segment: Segment) -> None:
    mask = segment.loss_mask
    if not mask.size or int(mask.max()) <= 1:
        return
    flat = int(np.flatnonzero(mask > 1)[0])
    row = int(np.searchsorted(segment.starts, flat, side="right")) - 1
    raise DatasetError(
        f"{segment.file}: row {segment.first_row + row}: loss_mask value {int(mask[flat])}; "
        "loss_mask must be 0 or 1 per token"
    )


def validate_segment(segment: Segment, vocab_size: int | None) -> None:
    """Check token ids against the vocabulary (if given) and that the mask is 0/1."""
    if vocab_size is not None:
        _check_vocab(segment, vocab_size)
    _check_mask_values(segment)


def _check_max_len(segment: Segment, max_len: int) -> None:
    too_long = np.flatnonzero(segment.lengths > max_len)
    if not len(too_long):
        return
    row = int(too_long[0])
    raise DatasetError(
        f"{segment.file}: row {segment.first_row + row} has {int(segment.lengths[row])} tokens, "
        f"more than max_len = {max_len} ({len(too_long)} such rows in this file part); "
        "set data.truncate = true, raise data.max_len, or prepare the data with --max-len"
    )


def _kept_rows(
    segments: list[Segment],
    max_len: int,
    truncate: bool,
    min_supervised: int,
    vocab_size: int | None,
) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray], int, int]:
    """Validate each segment and pick the rows with at least ``min_supervised``
    supervised tokens (after truncation to ``max_len``): per segment their segment index,
    start and length, plus the counts of truncated rows and supervised tokens kept."""
    kept_segment, kept_start, kept_length = [], [], []
    num_truncated = num_supervised = 0
    for index, segment in enumerate(segments):
        validate_segment(segment, vocab_size)
        if not truncate:
            _check_max_len(segment, max_len)
        lengths = np.minimum(segment.lengths, max_len)
        supervised = supervised_counts(segment.loss_mask, segment.starts, lengths)
        keep = supervised >= min_supervised
        kept_segment.append(np.full(int(keep.sum()), index, dtype=np.int32))
        kept_start.append(segment.starts[keep])
        kept_length.append(lengths[keep])
        num_truncated += int((segment.lengths[keep] > max_len).sum())
        num_supervised += int(supervised[keep].sum())
    return kept_segment, kept_start, kept_length, num_truncated, num_supervised


def open_dataset(
    path: str | Path,
    *,
    max_len: int,
    truncate: bool,
    block_size: int,
    vocab_size: int | None = None,
) -> TokenDataset:
    """Open, validate and filter a dataset directory (or a single data file).

    Raises DatasetError naming the file (and row) for a missing column, a wrong column
    type, mismatched input_ids/loss_mask lengths, a token id >= `vocab_size`, a row longer
    than `max_len` when `truncate` is false, an unreadable file, or an empty dataset.
    """
    path = Path(path)
    if max_len < 1 or block_size < 1:
        raise DatasetError(f"{path}: max_len and block_size must be positive")
    segments: list[Segment] = []
    tables: list[pa.Table] = []
    for file in list_data_files(path):
        file_segments, file_tables = read_segments(file)
        segments += file_segments
        tables += file_tables
    total_rows = sum(len(s.lengths) for s in segments)
    if total_rows == 0:
        raise DatasetError(f"{path}: the dataset has no rows; prepare it again")
    min_supervised = 2 * block_size
    kept = _kept_rows(segments, max_len, truncate, min_supervised, vocab_size)
    kept_segment, kept_start, kept_length, num_truncated, num_supervised = kept
    row_length = np.concatenate(kept_length)
    num_dropped = total_rows - len(row_length)
    if num_dropped:
        log.info(
            "%s: dropped %d of %d rows with fewer than %d supervised tokens (2 x block_size)",
            path,
            num_dropped,
            total_rows,
            min_supervised,
        )
    if not len(row_length):
        raise DatasetError(
            f"{path}: all {total_rows} rows have fewer than {min_supervised} supervised tokens "
            "(2 x block_size); check that loss_mask marks the assistant tokens"
        )
    return TokenDataset(
        path=path,
        segments=segments,
        row_segment=np.concatenate(kept_segment),
        row_start=np.concatenate(kept_start),
        row_length=row_length,
        num_dropped=num_dropped,
        num_truncated=num_truncated,
        num_supervised=num_supervised,
        tables=tables,
    )
