"""Dataset reader: validation errors name file and row; truncation, dropping, formats."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ringtrain.data import DatasetError, open_dataset
from ringtrain.data.dataset import supervised_counts
from ringtrain.data.sources import source_counts
from ringtrain.data.writer import TokenFileWriter
from tests.helpers.arrow_ipc import write_ipc

BLOCK = 2  # rows need >= 4 supervised tokens


def _rows(lengths: list[int], supervised: int | None = None) -> tuple[list, list]:
    ids = [list(range(1, n + 1)) for n in lengths]
    masks = [[0] * (n - min(n, supervised or n)) + [1] * min(n, supervised or n) for n in lengths]
    return ids, masks


INT32, UINT8 = pa.int32(), pa.uint8()


def _table(ids, masks, id_type=INT32, mask_type=UINT8) -> pa.Table:
    return pa.table(
        {
            "input_ids": pa.array(ids, type=pa.list_(id_type)),
            "loss_mask": pa.array(masks, type=pa.list_(mask_type)),
            "extra": pa.array([str(i) for i in range(len(ids))]),
        }
    )


def _open(path: Path, **kw):
    args = {"max_len": 64, "truncate": True, "block_size": BLOCK} | kw
    return open_dataset(path, **args)


def _row_tokens(ds, i: int) -> np.ndarray:
    seg = ds.segments[ds.row_segment[i]]
    return seg.input_ids[ds.row_start[i] : ds.row_start[i] + ds.row_length[i]]


def test_files_concatenate_across_formats_and_record_batches(tmp_path: Path) -> None:
    ids, masks = _rows([5, 6, 7, 8, 9])
    write_ipc(tmp_path / "a.arrow", _table(ids[:3], masks[:3]))
    write_ipc(tmp_path / "b.arrow", _table(ids[3:4], masks[3:4]), stream=True)
    pq.write_table(
        _table(ids[4:], masks[4:], id_type=pa.int64(), mask_type=pa.int8()), tmp_path / "c.parquet"
    )
    (tmp_path / "notes.txt").write_text("ignored")
    ds = _open(tmp_path)
    assert ds.num_rows == 5
    assert ds.num_tokens == 35
    assert ds.max_row_len == 9 and ds.min_row_len == 5
    assert len(ds.segments) == 4  # a.arrow holds two record batches
    for i, expected in enumerate(ids):
        np.testing.assert_array_equal(_row_tokens(ds, i), expected)
    assert all(seg.input_ids.dtype == np.int32 for seg in ds.segments)
    assert all(seg.loss_mask.dtype == np.uint8 for seg in ds.segments)


def test_ipc_columns_are_memory_mapped_views(tmp_path: Path) -> None:
    ids, masks = _rows([10] * 4)
    write_ipc(tmp_path / "a.arrow", _table(ids, masks), rows_per_batch=4)
    ds = _open(tmp_path)
    assert not ds.segments[0].input_ids.flags.owndata
    assert not ds.segments[0].loss_mask.flags.owndata


def test_truncation_and_dropping(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # Row 1 has its only supervised tokens beyond max_len: dropped after truncation.
    ids = [list(range(1, 21)), list(range(1, 21)), list(range(1, 4))]
    masks = [[1] * 20, [0] * 12 + [1] * 8, [1] * 3]
    write_ipc(tmp_path / "a.arrow", _table(ids, masks))
    with caplog.at_level(logging.INFO, logger="ringtrain.data"):
        ds = _open(tmp_path, max_len=10)
    assert ds.num_rows == 1 and ds.num_dropped == 2
    assert ds.num_truncated == 1 and ds.max_row_len == 10
    assert ds.num_supervised == 10
    assert "dropped 2 of 3 rows" in caplog.text
    # A row of exactly max_len is kept whole, not counted as truncated.
    assert _open(tmp_path, max_len=20).num_truncated == 0


def test_row_longer_than_max_len_without_truncation_names_file_and_row(tmp_path: Path) -> None:
    ids, masks = _rows([5, 6, 30, 5])
    write_ipc(tmp_path / "a.arrow", _table(ids, masks))
    with pytest.raises(
        DatasetError, match=r"a\.arrow: row 2 has 30 tokens.*max_len = 20.*truncate"
    ):
        _open(tmp_path, max_len=20, truncate=False)


def test_missing_column(tmp_path: Path) -> None:
    pq.write_table(
        pa.table({"input_ids": pa.array([[1, 2]], type=pa.list_(pa.int32()))}),
        tmp_path / "x.parquet",
    )
    with pytest.raises(DatasetError, match=r"x\.parquet: missing column 'loss_mask'"):
        _open(tmp_path)


@pytest.mark.parametrize(
    ("column", "array"),
    [
        ("input_ids", pa.array(["a b"])),
        ("input_ids", pa.array([[1.0, 2.0]], type=pa.list_(pa.float32()))),
        ("loss_mask", pa.array([1])),
    ],
)
def test_wrong_type(tmp_path: Path, column: str, array: pa.Array) -> None:
    columns = {
        "input_ids": pa.array([[1, 2]], type=pa.list_(pa.int32())),
        "loss_mask": pa.array([[1, 1]], type=pa.list_(pa.uint8())),
    }
    columns[column] = array
    write_ipc(tmp_path / "w.arrow", pa.table(columns))
    with pytest.raises(
        DatasetError, match=rf"w\.arrow: column '{column}' has type .*expected a list of integers"
    ):
        _open(tmp_path)


def test_length_mismatch_names_row(tmp_path: Path) -> None:
    ids, masks = _rows([5, 6, 7])
    masks[2] = masks[2][:-1]
    write_ipc(tmp_path / "m.arrow", _table(ids, masks), rows_per_batch=10)
    with pytest.raises(
        DatasetError, match=r"m\.arrow: row 2: input_ids has 7 tokens but loss_mask has 6"
    ):
        _open(tmp_path)


@pytest.mark.parametrize("token", [500, 100], ids=["far-out", "the-vocabulary-size"])
def test_token_out_of_vocab_names_row(tmp_path: Path, token: int) -> None:
    ids, masks = _rows([5, 6, 7, 8])
    ids[3][2] = token
    write_ipc(tmp_path / "v.arrow", _table(ids, masks))
    assert _open(tmp_path).num_rows == 4  # no vocabulary given: not checked
    with pytest.raises(DatasetError, match=rf"v\.arrow: row 3: token id {token} .*\[0, 100\)"):
        _open(tmp_path, vocab_size=100)
    ids[3][2] = 99  # the vocabulary's last id
    write_ipc(tmp_path / "v.arrow", _table(ids, masks))
    assert _open(tmp_path, vocab_size=100).num_rows == 4


def test_null_row_names_row(tmp_path: Path) -> None:
    ids, masks = _rows([5, 6])
    ids[1] = None
    write_ipc(tmp_path / "n.arrow", _table(ids, masks))
    with pytest.raises(DatasetError, match=r"n\.arrow: row 1: column 'input_ids' is null"):
        _open(tmp_path)


@pytest.mark.parametrize("value", [7, 2])
def test_mask_values_other_than_0_1(tmp_path: Path, value: int) -> None:
    ids, masks = _rows([5, 6])
    masks[1][3] = value
    write_ipc(tmp_path / "k.arrow", _table(ids, masks))
    with pytest.raises(DatasetError, match=rf"k\.arrow: row 1: loss_mask value {value}"):
        _open(tmp_path)


def test_empty_dataset(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match=r"no \.arrow or \.parquet files"):
        _open(tmp_path)
    write_ipc(tmp_path / "e.arrow", _table([], []))
    with pytest.raises(DatasetError, match="has no rows"):
        _open(tmp_path)


def test_all_rows_dropped(tmp_path: Path) -> None:
    ids, masks = _rows([5, 6], supervised=1)
    write_ipc(tmp_path / "d.arrow", _table(ids, masks))
    with pytest.raises(DatasetError, match="all 2 rows have fewer than 4 supervised tokens"):
        _open(tmp_path)


def test_unreadable_file(tmp_path: Path) -> None:
    (tmp_path / "broken.arrow").write_bytes(b"this is not arrow at all")
    with pytest.raises(DatasetError, match=r"broken\.arrow: cannot read this file"):
        _open(tmp_path)


def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="no such dataset"):
        _open(tmp_path / "nowhere")


def test_writer_splits_record_batches_and_reads_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("ringtrain.data.writer.MAX_BATCH_TOKENS", 16)
    lengths = np.array([5, 9, 4, 12, 7, 20, 6])
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    ids = np.arange(offsets[-1], dtype=np.int32)
    mask = np.ones(offsets[-1], dtype=np.uint8)
    with TokenFileWriter(tmp_path / "w.arrow") as writer:
        writer.write(offsets, ids, mask)
    ds = _open(tmp_path)
    assert len(ds.segments) > 1
    # A record batch stays within the token limit unless it is one longer row.
    assert all(s.lengths.sum() <= 16 or len(s.lengths) == 1 for s in ds.segments)
    for i in range(len(lengths)):
        np.testing.assert_array_equal(_row_tokens(ds, i), ids[offsets[i] : offsets[i + 1]])


def test_supervised_counts_are_exact_across_scan_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mask is scanned in chunks; runs crossing chunk boundaries count in full."""
    monkeypatch.setattr("ringtrain.data.dataset._EDGE_CHUNK_TOKENS", 7)
    rng = np.random.default_rng(0)
    mask = (rng.random(500) < 0.5).astype(np.uint8)
    mask[:3] = mask[-3:] = 1
    starts = rng.integers(0, 500, size=200)
    lengths = rng.integers(0, 500 - starts + 1)
    expected = [int(mask[s : s + n].sum()) for s, n in zip(starts, lengths, strict=True)]
    np.testing.assert_array_equal(supervised_counts(mask, starts, lengths), expected)


def test_writer_keeps_each_rows_source_across_record_batches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("ringtrain.data.writer.MAX_BATCH_TOKENS", 16)
    lengths = np.array([5, 9, 4, 12, 7])
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    ids = np.arange(offsets[-1], dtype=np.int32)
    with TokenFileWriter(tmp_path / "s.arrow", ["a", "b", "c"]) as writer:
        writer.write(offsets, ids, np.ones(len(ids), np.uint8), np.array([0, 1, 1, 2, 0]))
    table = pa.ipc.open_file(pa.memory_map(str(tmp_path / "s.arrow"))).read_all()
    assert table.column("source").num_chunks > 1
    assert table.column("source").to_pylist() == ["a", "b", "b", "c", "a"]
    assert source_counts(tmp_path) == {"a": 2, "b": 2, "c": 1}


@pytest.mark.parametrize("token", [-1, 2**31])
def test_wide_token_ids_outside_int32_are_refused(tmp_path: Path, token: int) -> None:
    ids, masks = _rows([5, 6])
    ids[1][2] = token
    pq.write_table(_table(ids, masks, id_type=pa.int64()), tmp_path / "w.parquet")
    with pytest.raises(DatasetError, match=r"w\.parquet: input_ids values out of the int32 range"):
        _open(tmp_path)
