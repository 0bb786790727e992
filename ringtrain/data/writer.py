"""Write token rows (flat arrays + offsets) as an Arrow IPC dataset file.

The schema is the one ringtrain reads: `input_ids: list<int32>`, `loss_mask:
list<uint8>`. Rows go into large record batches (each becomes one segment when read,
and fewer segments make batch assembly cheaper); a record batch never exceeds the
int32 offsets of `list<>`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

SCHEMA = pa.schema([("input_ids", pa.list_(pa.int32())), ("loss_mask", pa.list_(pa.uint8()))])
MAX_BATCH_TOKENS = 1 << 30


def _record_batch(
    offsets: np.ndarray, input_ids: np.ndarray, loss_mask: np.ndarray
) -> pa.RecordBatch:
    base = int(offsets[0])
    local = pa.array((offsets - base).astype(np.int32))
    end = int(offsets[-1])
    return pa.RecordBatch.from_arrays(
        [
            pa.ListArray.from_arrays(local, pa.array(input_ids[base:end], type=pa.int32())),
            pa.ListArray.from_arrays(local, pa.array(loss_mask[base:end], type=pa.uint8())),
        ],
        schema=SCHEMA,
    )


class TokenFileWriter:
    """Append rows to one Arrow IPC file; use as a context manager."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._sink = pa.OSFile(str(self.path), "wb")
        self._writer = pa.ipc.new_file(self._sink, SCHEMA)

    def write(self, offsets: np.ndarray, input_ids: np.ndarray, loss_mask: np.ndarray) -> None:
        """Write rows given as offsets [rows+1] into flat int32 ids and uint8 mask arrays."""
        offsets = np.asarray(offsets, dtype=np.int64)
        first = 0
        while first < len(offsets) - 1:
            limit = offsets[first] + MAX_BATCH_TOKENS
            last = max(int(np.searchsorted(offsets, limit, side="right")) - 1, first + 1)
            self._writer.write_batch(_record_batch(offsets[first : last + 1], input_ids, loss_mask))
            first = last

    def close(self) -> None:
        """Finish the file (writes the footer)."""
        self._writer.close()
        self._sink.close()

    def __enter__(self) -> TokenFileWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
