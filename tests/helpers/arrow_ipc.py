"""An Arrow IPC file written for the dataset tests, in either format: the file format (as
ringtrain writes) or the stream format (as Hugging Face `datasets` writes)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa


def write_ipc(path: Path, table: pa.Table, stream: bool = False, rows_per_batch: int = 2) -> Path:
    """Write `table` to `path` in record batches of `rows_per_batch` rows; return `path`."""
    with pa.OSFile(str(path), "wb") as sink:
        opener = pa.ipc.new_stream if stream else pa.ipc.new_file
        with opener(sink, table.schema) as writer:
            for batch in table.to_batches(max_chunksize=rows_per_batch):
                writer.write_batch(batch)
    return path
