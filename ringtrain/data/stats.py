"""Validate a dataset directory and summarise it (what `ringtrain-data inspect` prints)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ringtrain.data.arrow_files import list_data_files, read_segments
from ringtrain.data.dataset import supervised_counts, validate_segment
from ringtrain.data.errors import DatasetError
from ringtrain.data.sources import source_counts


def dataset_statistics(
    path: str | Path, *, vocab_size: int | None = None, block_size: int = 16
) -> dict[str, Any]:
    """Validate every file (as `open_dataset` does) and return JSON-able statistics.

    Lengths are reported before any truncation; `rows_too_few_supervised` counts the rows
    that training would drop (fewer than 2 * block_size supervised tokens); `sources`
    holds the rows per source of a mixed dataset (None otherwise).
    """
    path = Path(path)
    files = list_data_files(path)
    lengths, supervised, segments = [], [], 0
    for file in files:
        for segment in read_segments(file)[0]:
            validate_segment(segment, vocab_size)
            lengths.append(segment.lengths)
            supervised.append(supervised_counts(segment.loss_mask, segment.starts, segment.lengths))
            segments += 1
    length = np.concatenate(lengths)
    counts = np.concatenate(supervised)
    if not len(length):
        raise DatasetError(f"{path}: the dataset has no rows; prepare it again")
    tokens = int(length.sum())
    edges = 2 ** np.arange(0, max(int(length.max()).bit_length(), 1) + 1)
    bins = np.concatenate([[0], edges])  # [0, 1), [1, 2), [2, 4), ...
    histogram, _ = np.histogram(length, bins=bins)
    return {
        "path": str(path),
        "files": len(files),
        "record_batches": segments,
        "rows": len(length),
        "tokens": tokens,
        "supervised_tokens": int(counts.sum()),
        "supervised_fraction": round(float(counts.sum()) / max(tokens, 1), 4),
        "length_min": int(length.min()),
        "length_mean": round(float(length.mean()), 1),
        "length_p50": int(np.percentile(length, 50)),
        "length_p99": int(np.percentile(length, 99)),
        "length_max": int(length.max()),
        "rows_without_supervision": int((counts == 0).sum()),
        "rows_too_few_supervised": int((counts < 2 * block_size).sum()),
        "block_size": block_size,
        "sources": source_counts(path),
        "length_histogram": {
            f"{int(low)}-{int(high) - 1}": int(n)
            for low, high, n in zip(bins[:-1], bins[1:], histogram, strict=True)
            if n
        },
    }


def format_statistics(stats: dict[str, Any]) -> str:
    """Human-readable report of `dataset_statistics`."""
    lines = [
        f"dataset            {stats['path']}",
        f"files              {stats['files']} ({stats['record_batches']} record batches)",
        f"rows               {stats['rows']}",
        f"tokens             {stats['tokens']}",
        f"supervised tokens  {stats['supervised_tokens']} ({stats['supervised_fraction']:.1%})",
        f"row length         min {stats['length_min']}, mean {stats['length_mean']}, "
        f"median {stats['length_p50']}, p99 {stats['length_p99']}, max {stats['length_max']}",
        f"rows dropped at training (< {2 * stats['block_size']} supervised tokens): "
        f"{stats['rows_too_few_supervised']} ({stats['rows_without_supervision']} with none)",
    ]
    if stats["sources"]:
        lines.append("rows per source:")
        lines += [f"  {name:>16} {rows:>10}" for name, rows in stats["sources"].items()]
    lines.append("length histogram:")
    peak = max(stats["length_histogram"].values())
    for bound, rows in stats["length_histogram"].items():
        bar = "#" * max(1, round(40 * rows / peak))
        lines.append(f"  {bound:>12} {rows:>10} {bar}")
    return "\n".join(lines)
