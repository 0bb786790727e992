"""Open the files of an Arrow dataset and expose its token columns as flat numpy arrays.

A dataset is a directory of Arrow IPC files (`.arrow`, file or stream format, as written
by ringtrain or by Hugging Face `datasets`) and/or `.parquet` files, or one such file.
Arrow IPC files are memory-mapped, so the token values are zero-copy views of the page
cache (shared by every process that opens the same files); parquet files are decoded
into memory. Each record batch of each file becomes one *segment*: a flat `input_ids`
array, a flat `loss_mask` array and the row offsets into both. No per-row Python object
is ever created.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ringtrain.data.errors import DatasetError

INPUT_IDS = "input_ids"
LOSS_MASK = "loss_mask"
DATA_SUFFIXES = (".arrow", ".parquet")
_INT32_MAX = np.iinfo(np.int32).max


@dataclass(frozen=True)
class Segment:
    """One record batch: flat token columns and the rows' starts and lengths in them."""

    file: Path
    first_row: int  # index in `file` of this segment's first row
    input_ids: np.ndarray  # int32 [tokens]
    loss_mask: np.ndarray  # uint8 [tokens]
    starts: np.ndarray  # int64 [rows], into input_ids / loss_mask
    lengths: np.ndarray  # int64 [rows]


def list_data_files(path: Path) -> list[Path]:
    """The data files of a dataset directory (sorted), or `[path]` for a single file."""
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise DatasetError(f"{path}: no such dataset file or directory (check data.path)")
    files = sorted(p for p in path.iterdir() if p.suffix in DATA_SUFFIXES and p.is_file())
    if not files:
        raise DatasetError(
            f"{path}: no .arrow or .parquet files in this directory "
            "(prepare one with `ringtrain-data prepare`)"
        )
    return files


def open_ipc(
    source: pa.MemoryMappedFile,
) -> pa.ipc.RecordBatchFileReader | pa.ipc.RecordBatchStreamReader:
    """A reader of an Arrow IPC file in either format: the file format (as ringtrain writes)
    or the stream format (as Hugging Face `datasets` writes)."""
    try:
        return pa.ipc.open_file(source)
    except pa.ArrowInvalid:
        source.seek(0)
        return pa.ipc.open_stream(source)


def _read_table(path: Path) -> pa.Table:
    """Read one file as a table; Arrow IPC files stay memory-mapped (zero copy)."""
    try:
        if path.suffix == ".parquet":
            names = pq.read_schema(path).names
            return pq.read_table(path, columns=[c for c in (INPUT_IDS, LOSS_MASK) if c in names])
        return open_ipc(pa.memory_map(str(path), "r")).read_all()
    except (OSError, pa.ArrowException) as exc:
        raise DatasetError(
            f"{path}: cannot read this file as Arrow IPC or parquet ({exc}); "
            "remove it from the dataset directory or re-create it"
        ) from None


def _list_type_error(path: Path, name: str, typ: pa.DataType) -> DatasetError:
    return DatasetError(
        f"{path}: column {name!r} has type {typ}, expected a list of integers "
        f"(list<{'int32' if name == INPUT_IDS else 'uint8'}>); re-create the dataset "
        "with `ringtrain-data prepare`"
    )


def _check_column_type(path: Path, table: pa.Table, name: str) -> None:
    if name not in table.column_names:
        raise DatasetError(
            f"{path}: missing column {name!r} (found: {', '.join(table.column_names) or 'none'}); "
            "a dataset needs input_ids and loss_mask, see `ringtrain-data prepare`"
        )
    typ = table.schema.field(name).type
    if not (pa.types.is_list(typ) or pa.types.is_large_list(typ)):
        raise _list_type_error(path, name, typ)
    value_type = typ.value_type
    allowed = pa.types.is_integer(value_type) or (
        name == LOSS_MASK and pa.types.is_boolean(value_type)
    )
    if not allowed:
        raise _list_type_error(path, name, typ)


def _flat_column(
    path: Path, name: str, chunk: pa.Array, first_row: int
) -> tuple[np.ndarray, np.ndarray]:
    """Offsets (int64, rebased to 0) and flat values of one list chunk, zero-copy if possible."""
    if chunk.null_count:
        row = first_row + int(np.flatnonzero(chunk.is_null().to_numpy(zero_copy_only=False))[0])
        raise DatasetError(f"{path}: row {row}: column {name!r} is null; drop or fix that row")
    offsets = chunk.offsets.to_numpy().astype(np.int64, copy=False)
    values = chunk.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
    if values.null_count:
        raise DatasetError(
            f"{path}: column {name!r} holds null values inside its lists "
            f"(rows {first_row}..{first_row + len(chunk) - 1}); fix the dataset"
        )
    flat = values.to_numpy(zero_copy_only=False)
    return offsets - offsets[0], flat


def _as_input_ids(path: Path, flat: np.ndarray, first_row: int) -> np.ndarray:
    if flat.dtype == np.int32:
        return flat
    if flat.size and (flat.min() < 0 or flat.max() > _INT32_MAX):
        raise DatasetError(
            f"{path}: input_ids values out of the int32 range in rows from {first_row}; "
            "token ids must be non-negative and below the vocabulary size"
        )
    return flat.astype(np.int32)


def _as_loss_mask(flat: np.ndarray) -> np.ndarray:
    if flat.dtype == np.uint8:
        return flat
    return (flat != 0).astype(np.uint8)


def read_segments(path: Path) -> tuple[list[Segment], list[pa.Table]]:
    """Read one data file into segments; also return the tables that own the memory."""
    table = _read_table(path)
    for name in (INPUT_IDS, LOSS_MASK):
        _check_column_type(path, table, name)
    table = table.select([INPUT_IDS, LOSS_MASK])
    ids_lengths = [len(c) for c in table.column(INPUT_IDS).chunks]
    if path.suffix == ".parquet" or ids_lengths != [len(c) for c in table.column(LOSS_MASK).chunks]:
        table = table.combine_chunks()
    ids_col, mask_col = table.column(INPUT_IDS), table.column(LOSS_MASK)
    segments = []
    first_row = 0
    for ids_chunk, mask_chunk in zip(ids_col.chunks, mask_col.chunks, strict=True):
        ids_off, ids_flat = _flat_column(path, INPUT_IDS, ids_chunk, first_row)
        mask_off, mask_flat = _flat_column(path, LOSS_MASK, mask_chunk, first_row)
        if not np.array_equal(ids_off, mask_off):
            bad = int(np.flatnonzero(np.diff(ids_off) != np.diff(mask_off))[0])
            raise DatasetError(
                f"{path}: row {first_row + bad}: "
                f"input_ids has {int(ids_off[bad + 1] - ids_off[bad])} "
                f"tokens but loss_mask has {int(mask_off[bad + 1] - mask_off[bad])}; "
                "every row needs one mask value per token"
            )
        segments.append(
            Segment(
                file=path,
                first_row=first_row,
                input_ids=_as_input_ids(path, ids_flat, first_row),
                loss_mask=_as_loss_mask(mask_flat),
                starts=ids_off[:-1],
                lengths=np.diff(ids_off),
            )
        )
        first_row += len(ids_chunk)
    return segments, [table]
