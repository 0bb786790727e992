"""The k largest entries' column ids of many short rows, as one kernel (``ringtrain::row_topk``).

`loss.top_ids` ranks each row of a loss chunk twice: its 768 group maxima, then the 1,024
entries of its top groups, 16 of each for DFlash2's candidate selector. aten's top-k is a
radix select of several passes (a few launches each) over every row, about 3.4 ms of a
small drafter's 68 ms step on an H100 for rows this short. Here, on CUDA, one Triton
program takes a tile of rows whole into registers and picks its k largest one after
another (the largest not yet taken, the lowest column among equals): one launch, a single
read of the rows. Elsewhere it is ``torch.topk``. Both return the ids largest first; among
equal entries the order may differ. A NaN entry ranks last here (first in torch.topk): a
row with one fails the step's finiteness check anyway.

A custom op, so Dynamo keeps it whole inside the compiled loss chunk; ids have no gradient.
"""

from __future__ import annotations

import functools

import torch

# Rows one program ranks; a row's entries are held whole (padded to a power of two).
ROWS_PER_PROGRAM = 4


@torch.library.custom_op("ringtrain::row_topk", mutates_args=())
def row_topk(values: torch.Tensor, k: int) -> torch.Tensor:
    """The column ids of each row's k largest entries, largest first: values [R, N] with
    k <= N; ids [R, k] int64."""
    if values.is_cuda:
        return _row_topk_cuda(values, k)
    return values.topk(k, dim=-1).indices


@row_topk.register_fake
def _(values: torch.Tensor, k: int) -> torch.Tensor:
    return values.new_empty((values.shape[0], k), dtype=torch.long)


def _row_topk_cuda(values: torch.Tensor, k: int) -> torch.Tensor:
    rows, width = values.shape
    ids = values.new_empty((rows, k), dtype=torch.long)
    values = values.contiguous()
    grid = (-(-rows // ROWS_PER_PROGRAM),)
    block = max(16, 1 << (width - 1).bit_length())
    _row_topk_kernel()[grid](values, ids, rows, width, k, block, ROWS_PER_PROGRAM)
    return ids


@functools.cache
def _row_topk_kernel():
    """The Triton kernel (imported on first CUDA use: CPU installs have no Triton)."""
    import triton
    import triton.language as tl

    @triton.jit
    def row_topk_kernel(
        values, ids, rows, width, K: tl.constexpr, BLOCK: tl.constexpr, ROWS: tl.constexpr
    ):
        row = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        col = tl.arange(0, BLOCK)
        in_row = row[:, None] < rows
        real = in_row & (col[None, :] < width)
        tile = tl.load(values + row[:, None].to(tl.int64) * width + col[None, :], mask=real)
        tile = tile.to(tl.float32)
        open_ = real  # entries not yet taken
        for rank in tl.static_range(K):
            largest = tl.max(tl.where(open_, tile, float("-inf")), axis=1)
            ties = open_ & (tile == largest[:, None])
            pick = tl.min(tl.where(ties, col[None, :], BLOCK), axis=1)
            # No open entry equals the maximum only where NaNs are left: the lowest open one.
            lowest_open = tl.min(tl.where(open_, col[None, :], BLOCK), axis=1)
            pick = tl.where(pick < BLOCK, pick, lowest_open)
            tl.store(ids + row.to(tl.int64) * K + rank, pick.to(tl.int64), mask=row < rows)
            open_ = open_ & (col[None, :] != pick[:, None])

    return row_topk_kernel
