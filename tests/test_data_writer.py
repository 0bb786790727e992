"""The token file writer: rows read back exactly (ids and loss mask) whatever record batch
they land in, record batches filled up to the token limit and a longer row in one of its
own, each row's source kept, and source ids given exactly when the writer has sources."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from ringtrain.data.writer import TokenFileWriter

LIMIT = 16  # tokens per record batch in these tests


@pytest.fixture(autouse=True)
def small_record_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("ringtrain.data.writer.MAX_BATCH_TOKENS", LIMIT)


def _rows(lengths: list[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Offsets, ids counting up from 1, and a mask that differs from row to row."""
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    ids = np.arange(1, offsets[-1] + 1, dtype=np.int32)
    mask = np.concatenate([np.arange(n) % (i + 2) == 0 for i, n in enumerate(lengths)])
    return offsets, ids, mask.astype(np.uint8)


def _read(path: Path) -> pa.Table:
    with pa.memory_map(str(path)) as source:
        return pa.ipc.open_file(source).read_all()


def _batch_rows(table: pa.Table) -> list[int]:
    return [len(chunk) for chunk in table.column("input_ids").chunks]


def _expected(offsets: np.ndarray, flat: np.ndarray) -> list[list[int]]:
    return [flat[a:b].tolist() for a, b in itertools.pairwise(offsets)]


def test_rows_read_back_exactly_across_record_batches(tmp_path: Path) -> None:
    offsets, ids, mask = _rows([5, 9, 4, 12, 7, 3, 6])
    with TokenFileWriter(tmp_path / "a.arrow") as writer:
        writer.write(offsets, ids, mask)
    table = _read(tmp_path / "a.arrow")
    assert len(_batch_rows(table)) > 2
    assert table.column("input_ids").to_pylist() == _expected(offsets, ids)
    assert table.column("loss_mask").to_pylist() == _expected(offsets, mask)
    assert table.schema.names == ["input_ids", "loss_mask"]


def test_record_batches_fill_up_to_the_token_limit(tmp_path: Path) -> None:
    offsets, ids, mask = _rows([4] * 9)
    with TokenFileWriter(tmp_path / "a.arrow") as writer:
        writer.write(offsets, ids, mask)
    assert _batch_rows(_read(tmp_path / "a.arrow")) == [4, 4, 1]  # 16, 16 and 4 tokens


def test_a_row_longer_than_the_limit_is_a_record_batch_of_its_own(tmp_path: Path) -> None:
    offsets, ids, mask = _rows([3, 20, 3, 3, 40])
    with TokenFileWriter(tmp_path / "a.arrow") as writer:
        writer.write(offsets, ids, mask)
    table = _read(tmp_path / "a.arrow")
    assert _batch_rows(table) == [1, 1, 2, 1]
    assert table.column("input_ids").to_pylist() == _expected(offsets, ids)


def test_several_writes_append_their_rows(tmp_path: Path) -> None:
    offsets, ids, mask = _rows([5, 6])
    with TokenFileWriter(tmp_path / "a.arrow") as writer:
        writer.write(offsets, ids, mask)
        writer.write(offsets, ids + 100, mask)
    rows = _read(tmp_path / "a.arrow").column("input_ids").to_pylist()
    assert rows == _expected(offsets, ids) + _expected(offsets, ids + 100)


def test_each_row_keeps_its_source_and_every_name_is_in_the_dictionary(tmp_path: Path) -> None:
    offsets, ids, mask = _rows([5, 9, 4, 12, 7])
    with TokenFileWriter(tmp_path / "a.arrow", ["code", "chat", "unused"]) as writer:
        writer.write(offsets, ids, mask, np.array([1, 0, 0, 1, 1]))
    table = _read(tmp_path / "a.arrow")
    assert table.column("source").to_pylist() == ["chat", "code", "code", "chat", "chat"]
    assert table.column("source").type == pa.dictionary(pa.int16(), pa.string())
    assert table.column("source").chunk(0).dictionary.to_pylist() == ["code", "chat", "unused"]


@pytest.mark.parametrize("with_sources", [True, False])
def test_source_ids_are_given_exactly_when_the_writer_has_sources(
    tmp_path: Path, with_sources: bool
) -> None:
    offsets, ids, mask = _rows([5, 6])
    sources = ["code"] if with_sources else None
    writer = TokenFileWriter(tmp_path / "a.arrow", sources)
    with pytest.raises(ValueError, match="give source_ids exactly when the writer was given"):
        writer.write(offsets, ids, mask, None if with_sources else np.zeros(2, np.int64))
    writer.close()
    assert _read(tmp_path / "a.arrow").num_rows == 0  # nothing written, the file whole
