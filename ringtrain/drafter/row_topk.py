"""The k largest entries' column ids of many short rows, as one kernel (``ringtrain::row_topk``).

`loss.top_ids` ranks each row of a loss chunk twice: its 768 group maxima, then the 1,024
entries of its top groups, 16 of each for DFlash2's candidate selector. aten's top-k is a
radix select of several passes (a few launches each) over every row, about 3.4 ms of a
small drafter's 68 ms step on an H100 for rows this short. Here, on CUDA, one Triton
program takes a tile of rows whole into registers and picks its k largest one after
another (the largest not yet taken, the lowest column among equals), each with one max
reduction over keys that pack an entry's value and column: one launch, a single read of
the rows. Elsewhere it is ``torch.topk``. Both return the ids largest first (NaN above
everything, as torch.topk ranks it); among equal entries the order may differ.

A custom op, so Dynamo keeps it whole inside the compiled loss chunk; ids have no gradient.
"""

from __future__ import annotations

import functools

import torch

# Rows one program ranks (a row's entries are held whole, padded to a power of two) and
# the warps it runs on: one row to one warp, so each pick's max reduction stays within a
# warp's registers (no shared memory, no barrier). On an H100 that took 46 us for a
# 4,096-row chunk's 768 group maxima and 170 us for 16,384 rows against 62 / 232 us with
# 4 rows on 4 warps (`python -m tools.bench.bench_row_topk`, BENCHMARKS.md).
ROWS_PER_PROGRAM = 1
WARPS = 1


@torch.library.custom_op("ringtrain::row_topk", mutates_args=())
def row_topk(values: torch.Tensor, k: int) -> torch.Tensor:
    """The column ids of each row's k largest entries, largest first: values [R, N] with
    k <= N; ids [R, k] int64."""
    if values.is_cuda:
        return row_topk_cuda(values, k)
    return values.topk(k, dim=-1).indices


@row_topk.register_fake
def _(values: torch.Tensor, k: int) -> torch.Tensor:
    return values.new_empty((values.shape[0], k), dtype=torch.long)


def row_topk_cuda(
    values: torch.Tensor, k: int, rows_per_program: int = ROWS_PER_PROGRAM, warps: int = WARPS
) -> torch.Tensor:
    """row_topk's CUDA kernel, launched with `rows_per_program` rows (a power of two) to a
    program of `warps` warps (tools/bench/bench_row_topk.py times the choices)."""
    rows, width = values.shape
    ids = values.new_empty((rows, k), dtype=torch.long)
    values = values.contiguous()
    grid = (-(-rows // rows_per_program),)
    block = max(16, 1 << (width - 1).bit_length())
    _row_topk_kernel()[grid](values, ids, rows, width, k, block, rows_per_program, num_warps=warps)
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
        real = (row[:, None] < rows) & (col[None, :] < width)
        tile = tl.load(values + row[:, None].to(tl.int64) * width + col[None, :], mask=real)
        # One int64 key per entry, ordered as (value, then the lower column): the float32's
        # bits made to sort as non-negative integers (negative floats with every bit but the
        # sign flipped, then all moved up by 2^31), times BLOCK, plus the column counted
        # down. One max reduction then picks each entry; a taken entry's key becomes -1.
        bits = tile.to(tl.float32).to(tl.int32, bitcast=True)
        ordered = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(tl.int64) + 0x80000000
        keys = tl.where(real, ordered * BLOCK + (BLOCK - 1 - col[None, :]), -1)
        for rank in tl.static_range(K):
            best = tl.max(keys, axis=1)
            pick = BLOCK - 1 - best % BLOCK
            tl.store(ids + row.to(tl.int64) * K + rank, pick, mask=row < rows)
            keys = tl.where(col[None, :] == pick[:, None], -1, keys)

    return row_topk_kernel
