"""The per-row source of a mixed dataset: a dictionary-encoded `source` column.

A dataset prepared from a mixture (``ringtrain.data.mixture``) says for every row which
source it came from, in a `source: dictionary<int16, string>` column beside the token
columns (training reads only the token columns); the mixed chat records name it in a
`source` field. ``source_counts`` reads it back: the
rows per source, as `prepare` reports them and `inspect` prints them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ringtrain.data.arrow_files import list_data_files, open_ipc
from ringtrain.data.errors import DatasetError

SOURCE = "source"  # the column, and the field of a mixed chat record that names its source
SOURCE_TYPE = pa.dictionary(pa.int16(), pa.string())
MAX_SOURCES = int(np.iinfo(np.int16).max)


def source_array(names: Sequence[str], ids: np.ndarray) -> pa.DictionaryArray:
    """The column of rows whose sources are ``names[ids[i]]``."""
    return pa.DictionaryArray.from_arrays(
        pa.array(np.asarray(ids, dtype=np.int16)), pa.array(list(names), type=pa.string())
    )


def _file_column(path: Path) -> pa.ChunkedArray | None:
    """The source column of one data file, or None when it has none."""
    try:
        if path.suffix == ".parquet":
            if SOURCE not in pq.read_schema(path).names:
                return None
            return pq.read_table(path, columns=[SOURCE]).column(SOURCE)
        with pa.memory_map(str(path), "r") as source:
            reader = open_ipc(source)
            if SOURCE not in reader.schema.names:
                return None
            return reader.read_all().column(SOURCE)
    except (OSError, pa.ArrowException) as exc:
        raise DatasetError(f"{path}: cannot read its source column ({exc})") from None


def source_counts(path: str | Path) -> dict[str, int] | None:
    """Rows per source of a dataset (every file), or None when it was not mixed."""
    counts: Counter = Counter()
    columns = [_file_column(file) for file in list_data_files(Path(path))]
    if all(column is None for column in columns):
        return None
    for column in columns:
        if column is None:
            raise DatasetError(
                f"{path}: some files have a source column and some not; prepare the "
                "dataset again into an empty directory"
            )
        for chunk in column.chunks:
            rows = np.bincount(chunk.indices.to_numpy(), minlength=len(chunk.dictionary))
            counts.update(dict(zip(chunk.dictionary.to_pylist(), rows.tolist(), strict=True)))
    return {name: rows for name, rows in sorted(counts.items()) if rows}
