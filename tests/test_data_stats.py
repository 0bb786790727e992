"""Dataset statistics (`ringtrain-data inspect`): counts over every row of every file."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ringtrain.data.stats import dataset_statistics, format_statistics
from ringtrain.data.writer import TokenFileWriter


def _write(path: Path, rows: list[tuple[int, int]]) -> None:
    """Rows of (length, supervised tokens), the supervised ones at the end."""
    lengths = np.array([n for n, _ in rows])
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    mask = np.concatenate([[0] * (n - s) + [1] * s for n, s in rows]).astype(np.uint8)
    with TokenFileWriter(path) as writer:
        writer.write(offsets, np.arange(offsets[-1], dtype=np.int32), mask)


def test_statistics_count_every_row(tmp_path: Path) -> None:
    _write(tmp_path / "a.arrow", [(1, 0), (3, 1), (10, 4)])
    _write(tmp_path / "b.arrow", [(64, 5), (128, 40)])
    stats = dataset_statistics(tmp_path, block_size=2)
    assert (stats["files"], stats["record_batches"], stats["rows"]) == (2, 2, 5)
    assert (stats["tokens"], stats["supervised_tokens"]) == (206, 50)
    assert (stats["length_min"], stats["length_max"]) == (1, 128)
    # lengths 1, 3, 10, 64, 128: the median is the middle row, the mean 41.2
    assert (stats["length_p50"], stats["length_mean"]) == (10, 41.2)
    assert stats["rows_without_supervision"] == 1
    assert stats["rows_too_few_supervised"] == 2  # 0 and 1 of 4 = 2 * block_size
    assert stats["length_histogram"] == {"1-1": 1, "2-3": 1, "8-15": 1, "64-127": 1, "128-255": 1}
    report = format_statistics(stats)
    assert "rows dropped at training (< 4 supervised tokens): 2 (1 with none)" in report
    assert "row length         min 1, mean 41.2, median 10, p99 125, max 128" in report
