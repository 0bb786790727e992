"""A dataset's Arrow files: which files of a directory are read and in what order, a single
file as the dataset, torn files named, the column types accepted and refused, and rows
named by their place in their file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ringtrain.data import DatasetError, open_dataset
from ringtrain.data.arrow_files import list_data_files, read_segments
from ringtrain.data.writer import TokenFileWriter
from tests.helpers.arrow_ipc import write_ipc


def _write_rows(path: Path, rows: list[list[int]]) -> Path:
    """Rows written as `ringtrain-data prepare` writes them, every token supervised."""
    lengths = np.array([len(r) for r in rows])
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    ids = np.array([t for r in rows for t in r], dtype=np.int32)
    with TokenFileWriter(path) as writer:
        writer.write(offsets, ids, np.ones(len(ids), np.uint8))
    return path


def _write_ipc(path: Path, ids: pa.Array, mask: pa.Array) -> Path:
    return write_ipc(path, pa.table({"input_ids": ids, "loss_mask": mask}))


def _lists(rows: list, value_type: pa.DataType) -> pa.Array:
    return pa.array(rows, type=pa.list_(value_type))


def _open(path: Path):
    return open_dataset(path, max_len=64, truncate=True, block_size=1)


def _all_rows(path: Path) -> list[list[int]]:
    ds = _open(path)
    rows = []
    for i in range(ds.num_rows):
        seg = ds.segments[ds.row_segment[i]]
        rows.append(seg.input_ids[ds.row_start[i] : ds.row_start[i] + ds.row_length[i]].tolist())
    return rows


def test_a_directorys_files_are_read_by_name_whatever_order_they_were_written_in(
    tmp_path: Path,
) -> None:
    order = [7, 2, 11, 0, 5, 9, 1, 10, 3, 8, 4, 6]
    for k in order:
        _write_rows(tmp_path / f"data-{k:05d}.arrow", [[k + 1, k + 1]])
    names = [p.name for p in list_data_files(tmp_path)]
    assert names == [f"data-{k:05d}.arrow" for k in range(12)]
    assert _all_rows(tmp_path) == [[k + 1, k + 1] for k in range(12)]


def test_only_data_files_are_listed(tmp_path: Path) -> None:
    _write_rows(tmp_path / "data-00000.arrow", [[1, 2, 3]])
    pq.write_table(
        pa.table(
            {"input_ids": _lists([[4, 5]], pa.int32()), "loss_mask": _lists([[1, 1]], pa.uint8())}
        ),
        tmp_path / "extra.parquet",
    )
    # A stopped prepare's torn output, a folder named like a data file, and other files.
    (tmp_path / "data-00001.arrow.partial").write_bytes(b"ARROW1\0\0 torn")
    (tmp_path / "old.arrow").mkdir()
    _write_rows(tmp_path / "old.arrow" / "data-00000.arrow", [[9, 9]])
    (tmp_path / "README.md").write_text("notes")
    assert [p.name for p in list_data_files(tmp_path)] == ["data-00000.arrow", "extra.parquet"]
    assert _all_rows(tmp_path) == [[1, 2, 3], [4, 5]]


@pytest.mark.parametrize("suffix", [".arrow", ".parquet"])
def test_a_single_file_is_the_whole_dataset(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"rows{suffix}"
    if suffix == ".arrow":
        _write_rows(path, [[1, 2], [3, 4, 5]])
    else:
        ids, mask = _lists([[1, 2], [3, 4, 5]], pa.int32()), _lists([[1, 1], [1, 1, 1]], pa.uint8())
        pq.write_table(pa.table({"input_ids": ids, "loss_mask": mask}), path)
    _write_rows(tmp_path / "other.arrow", [[7, 7]])  # beside it, not part of it
    assert list_data_files(path) == [path]
    assert _all_rows(path) == [[1, 2], [3, 4, 5]]


@pytest.mark.parametrize("keep", [0.5, 0.0], ids=["torn", "empty"])
def test_a_torn_file_is_named_with_the_fix(tmp_path: Path, keep: float) -> None:
    _write_rows(tmp_path / "data-00000.arrow", [[1, 2, 3]] * 4)
    torn = _write_rows(tmp_path / "data-00001.arrow", [[4, 5, 6]] * 40)
    data = torn.read_bytes()
    torn.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(DatasetError) as info:
        _open(tmp_path)
    message = str(info.value)
    assert "data-00001.arrow: cannot read this file as Arrow IPC or parquet" in message
    assert "remove it from the dataset directory or re-create it" in message


def test_large_lists_wide_ids_and_a_boolean_mask_are_accepted(tmp_path: Path) -> None:
    rows = [[0, 5, 2**31 - 1], [3, 4]]
    ids = pa.array(rows, type=pa.large_list(pa.int64()))
    mask = pa.array([[False, True, True], [True, False]], type=pa.list_(pa.bool_()))
    path = _write_ipc(tmp_path / "wide.arrow", ids, mask)
    (segment,), _ = read_segments(path)
    assert segment.input_ids.dtype == np.int32 and segment.loss_mask.dtype == np.uint8
    assert segment.input_ids.tolist() == [0, 5, 2**31 - 1, 3, 4]
    assert segment.loss_mask.tolist() == [0, 1, 1, 1, 0]
    assert segment.lengths.tolist() == [3, 2]


@pytest.mark.parametrize(
    ("column", "array", "expected"),
    [
        ("input_ids", _lists([[True, False]], pa.bool_()), "list<int32>"),
        ("loss_mask", _lists([[1.0, 0.0]], pa.float32()), "list<uint8>"),
        ("loss_mask", pa.array(["yes"]), "list<uint8>"),
    ],
)
def test_a_wrong_column_type_names_the_type_expected(
    tmp_path: Path, column: str, array: pa.Array, expected: str
) -> None:
    columns = {"input_ids": _lists([[1, 2]], pa.int32()), "loss_mask": _lists([[1, 1]], pa.uint8())}
    columns[column] = array
    path = _write_ipc(tmp_path / "t.arrow", columns["input_ids"], columns["loss_mask"])
    with pytest.raises(DatasetError) as info:
        read_segments(path)
    message = str(info.value)
    assert f"t.arrow: column '{column}' has type {array.type}" in message
    assert f"expected a list of integers ({expected})" in message


def test_a_null_row_in_a_later_record_batch_is_named_by_its_row_in_the_file(
    tmp_path: Path,
) -> None:
    rows = [[1, 2], [3, 4], [5, 6], None, [7, 8]]
    masks = [[1, 1]] * 5
    path = _write_ipc(tmp_path / "n.arrow", _lists(rows, pa.int32()), _lists(masks, pa.uint8()))
    with pytest.raises(DatasetError, match=r"n\.arrow: row 3: column 'input_ids' is null"):
        read_segments(path)


def test_null_values_inside_a_rows_list_are_refused(tmp_path: Path) -> None:
    rows = [[1, 2], [3, 4], [5, None, 6], [7, 8]]
    masks = [[1, 1], [1, 1], [1, 1, 1], [1, 1]]
    path = _write_ipc(tmp_path / "v.arrow", _lists(rows, pa.int32()), _lists(masks, pa.uint8()))
    with pytest.raises(DatasetError) as info:
        read_segments(path)
    assert "v.arrow: column 'input_ids' holds null values inside its lists (rows 2..3)" in str(
        info.value
    )


def test_a_length_mismatch_in_a_later_record_batch_is_named_by_its_row_in_the_file(
    tmp_path: Path,
) -> None:
    rows = [[1, 2], [3, 4], [5, 6], [7, 8, 9]]
    masks = [[1, 1], [1, 1], [1, 1], [1, 1]]
    path = _write_ipc(tmp_path / "m.arrow", _lists(rows, pa.int32()), _lists(masks, pa.uint8()))
    with pytest.raises(
        DatasetError, match=r"m\.arrow: row 3: input_ids has 3 tokens but loss_mask has 2"
    ):
        read_segments(path)


def test_segments_record_their_first_row_in_the_file(tmp_path: Path) -> None:
    rows = [[1, 2], [3], [4, 5, 6], [7, 8], [9]]
    masks = [[1] * len(r) for r in rows]
    path = _write_ipc(tmp_path / "s.arrow", _lists(rows, pa.int32()), _lists(masks, pa.uint8()))
    segments, _ = read_segments(path)
    assert [s.first_row for s in segments] == [0, 2, 4]
    assert [s.lengths.tolist() for s in segments] == [[2, 1], [3, 2], [1]]
