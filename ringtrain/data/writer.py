"""Write token rows (flat arrays + offsets) as an Arrow IPC dataset file.

The schema is the one ringtrain reads: `input_ids: list<int32>`, `loss_mask:
list<uint8>`, and for a mixed dataset the rows' `source` (``ringtrain.data.sources``).
Rows go into large record batches (each becomes one segment when read, and fewer
segments make batch assembly cheaper); a record batch never exceeds the int32 offsets
of `list<>`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa

from ringtrain.data.sources import SOURCE, SOURCE_TYPE, source_array

SCHEMA = pa.schema([("input_ids", pa.list_(pa.int32())), ("loss_mask", pa.list_(pa.uint8()))])
MAX_BATCH_TOKENS = 1 << 30


def _token_columns(
    offsets: np.ndarray, input_ids: np.ndarray, loss_mask: np.ndarray
) -> list[pa.Array]:
    base = int(offsets[0])
    local = pa.array((offsets - base).astype(np.int32))
    end = int(offsets[-1])
    return [
        pa.ListArray.from_arrays(local, pa.array(input_ids[base:end], type=pa.int32())),
        pa.ListArray.from_arrays(local, pa.array(loss_mask[base:end], type=pa.uint8())),
    ]


class TokenFileWriter:
    """Append rows to one Arrow IPC file; use as a context manager. With ``sources`` (the
    names of a mixture's sources) every row also gets its source."""

    def __init__(self, path: str | Path, sources: Sequence[str] | None = None) -> None:
        self.path = Path(path)
        self.sources = list(sources) if sources is not None else None
        schema = SCHEMA if sources is None else SCHEMA.append(pa.field(SOURCE, SOURCE_TYPE))
        self._schema = schema
        self._sink = pa.OSFile(str(self.path), "wb")
        self._writer = pa.ipc.new_file(self._sink, schema)

    def write(
        self,
        offsets: np.ndarray,
        input_ids: np.ndarray,
        loss_mask: np.ndarray,
        source_ids: np.ndarray | None = None,
    ) -> None:
        """Write rows given as offsets [rows+1] into flat int32 ids and uint8 mask arrays
        (and, for a writer with sources, each row's index into them)."""
        if (source_ids is None) != (self.sources is None):
            raise ValueError("give source_ids exactly when the writer was given sources")
        offsets = np.asarray(offsets, dtype=np.int64)
        first = 0
        while first < len(offsets) - 1:
            limit = offsets[first] + MAX_BATCH_TOKENS
            last = max(int(np.searchsorted(offsets, limit, side="right")) - 1, first + 1)
            columns = _token_columns(offsets[first : last + 1], input_ids, loss_mask)
            if self.sources is not None:
                columns.append(source_array(self.sources, source_ids[first:last]))
            self._writer.write_batch(pa.RecordBatch.from_arrays(columns, schema=self._schema))
            first = last

    def close(self) -> None:
        """Finish the file (writes the footer)."""
        self._writer.close()
        self._sink.close()

    def __enter__(self) -> TokenFileWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
