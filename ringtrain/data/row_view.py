"""One dataset row decoded, its supervised tokens marked (`ringtrain-data inspect --row N`).

The supervised spans (loss_mask = 1: the tokens the drafter learns to predict) are
wrapped in ⟦ ⟧, brackets that read well in a terminal and in a log and that chat text
hardly ever contains. Each span is decoded on its own, so a character whose bytes
straddle a span boundary may show as a replacement character there.
"""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np

from ringtrain.data.arrow_files import list_data_files, read_segments
from ringtrain.data.dataset import mask_spans, validate_segment
from ringtrain.data.errors import DatasetError

OPEN, CLOSE = "⟦", "⟧"


def read_row(path: str | Path, row: int) -> tuple[np.ndarray, np.ndarray]:
    """Row `row` (0-based, over the dataset's files in order): its input_ids and loss_mask."""
    path = Path(path)
    if row < 0:
        raise DatasetError(f"--row {row}: rows are numbered from 0")
    seen = 0
    for file in list_data_files(path):
        for segment in read_segments(file)[0]:
            if row < seen + len(segment.lengths):
                validate_segment(segment, None)
                start, length = segment.starts[row - seen], segment.lengths[row - seen]
                span = slice(int(start), int(start + length))
                return np.array(segment.input_ids[span]), np.array(segment.loss_mask[span])
            seen += len(segment.lengths)
    raise DatasetError(
        f"{path}: there is no row {row}; the dataset has {seen} rows (0..{seen - 1})"
    )


def row_view(path: str | Path, row: int, tokenizer: Any) -> dict[str, Any]:
    """Row `row` decoded by `tokenizer` as pieces alternating unsupervised / supervised,
    and as one text with the supervised pieces wrapped in ⟦ ⟧ (JSON-able)."""
    ids, mask = read_row(path, row)
    starts, ends = mask_spans(mask)
    bounds = sorted({0, len(ids), *starts.tolist(), *ends.tolist()})
    pieces = [
        {"supervised": bool(mask[low]), "text": tokenizer.decode(ids[low:high].tolist())}
        for low, high in pairwise(bounds)
    ]
    text = "".join(f"{OPEN}{p['text']}{CLOSE}" if p["supervised"] else p["text"] for p in pieces)
    return {
        "path": str(path),
        "row": row,
        "tokens": len(ids),
        "supervised_tokens": int(mask.sum()),
        "pieces": pieces,
        "text": text,
    }


def format_row(view: dict[str, Any], block_size: int) -> str:
    """Human-readable `row_view`: a header line, then the marked text; says when training
    drops the row (fewer than 2 * block_size supervised tokens)."""
    header = (
        f"row {view['row']} of {view['path']}: {view['tokens']} tokens, "
        f"{view['supervised_tokens']} supervised (marked {OPEN} {CLOSE})"
    )
    if view["supervised_tokens"] < 2 * block_size:
        header += (
            f"; training drops this row (fewer than {2 * block_size} supervised tokens, "
            f"2 x block size {block_size})"
        )
    return f"{header}\n{view['text']}"
