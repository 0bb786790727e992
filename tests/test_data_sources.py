"""Rows per source of a dataset (what `prepare` reports and `inspect` prints): summed over
every record batch and file, Arrow IPC (file or stream format) and parquet alike, listed by
name without the sources no row came from; a dataset that was not mixed has none, and one
whose files disagree or cannot be read is refused naming the file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ringtrain.data.errors import DatasetError
from ringtrain.data.sources import SOURCE_TYPE, source_array, source_counts
from ringtrain.data.stats import dataset_statistics
from tests.helpers.arrow_ipc import write_ipc


def _table(names: list[str] | None, ids: list[int]) -> pa.Table:
    """One two-token row per id, with a source column when ``names`` are given."""
    columns = {
        "input_ids": pa.array([[1, 2]] * len(ids), type=pa.list_(pa.int32())),
        "loss_mask": pa.array([[0, 1]] * len(ids), type=pa.list_(pa.uint8())),
    }
    if names is not None:
        columns["source"] = source_array(names, np.array(ids))
    return pa.table(columns)


def test_a_source_array_names_each_rows_source() -> None:
    names = [f"source-{i}" for i in range(300)]
    column = source_array(names, np.array([299, 0, 200]))
    assert column.type == SOURCE_TYPE
    assert column.to_pylist() == ["source-299", "source-0", "source-200"]


def test_rows_are_counted_over_every_batch_and_file_and_listed_by_name(tmp_path: Path) -> None:
    write_ipc(tmp_path / "a.arrow", _table(["web", "code", "chat"], [1, 1, 0, 1, 0]))
    pq.write_table(_table(["chat", "web"], [0, 1, 1]), tmp_path / "b.parquet")
    write_ipc(tmp_path / "c.arrow", _table(["code", "math"], [0, 0, 0, 0]), stream=True)
    counts = source_counts(tmp_path)
    assert counts == {"chat": 1, "code": 7, "web": 4}  # "math" had no row
    assert list(counts) == ["chat", "code", "web"]


@pytest.mark.parametrize("suffix", [".arrow", ".parquet", ".stream.arrow"])
def test_a_dataset_that_was_not_mixed_has_no_sources(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"a{suffix}"
    if suffix == ".parquet":
        pq.write_table(_table(None, [0, 0]), path)
    else:
        write_ipc(path, _table(None, [0, 0]), stream=suffix == ".stream.arrow")
    assert source_counts(tmp_path) is None
    assert dataset_statistics(tmp_path, block_size=1)["sources"] is None


def test_a_stream_format_dataset_has_its_rows_per_source(tmp_path: Path) -> None:
    write_ipc(tmp_path / "a.arrow", _table(["code", "chat"], [1, 0, 1]), stream=True)
    assert dataset_statistics(tmp_path, block_size=1)["sources"] == {"chat": 2, "code": 1}


def test_files_with_and_without_sources_are_refused(tmp_path: Path) -> None:
    write_ipc(tmp_path / "a.arrow", _table(None, [0]))
    write_ipc(tmp_path / "b.arrow", _table(["code"], [0]))
    with pytest.raises(DatasetError, match="some files have a source column and some not"):
        source_counts(tmp_path)


def test_an_unreadable_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "a.arrow").write_bytes(b"not an arrow file at all")
    with pytest.raises(DatasetError, match=r"a\.arrow: cannot read its source column"):
        source_counts(tmp_path)
