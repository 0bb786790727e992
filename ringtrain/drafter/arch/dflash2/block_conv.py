"""DFlash2's in-block dynamic convolution as one op (``ringtrain::block_conv``) with its own
backward.

``out[t, c] = sum_j (base[j, c] + delta[t, j, c // group]) * x[t - j, c]`` over the taps j
of a depthwise convolution along block positions, never across a block boundary (block
position t < j reads zero); x [L, H] holds whole blocks one after another. Its gradients:

- ``dx[t, c] = sum_j (base[j, c] + delta[t + j, j, c // group]) * dout[t + j, c]`` (t + j in
  t's block),
- ``ddelta[t, j, g] = sum over c of group g of dout[t, c] * x[t - j, c]``,
- ``dbase[j, c] = sum_t dout[t, c] * x[t - j, c]``.

Backward keeps the inputs only (x and the corrections), not the output. On CUDA one
Triton program takes a tile of whole blocks by 64 channels: forward reads x and delta once
and writes out; backward reads dout, x and delta once and writes dx, ddelta and each
tile's partial dbase (summed after). Composed of tensor ops instead, Inductor split the
eight convolutions of a recipe-sized drafter into about 100 kernels (5.6 of a 62 ms step
on an H100), and the output was formed a second time in backward to save its memory.
Elsewhere (CPU, float64, a group size that is not a power of two) the same sums run as
tensor ops.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

# Channels per Triton program (at least one whole group), rows per program (whole blocks).
TILE_CHANNELS = 64
TILE_ROWS = 64


def _blocks(x: torch.Tensor, block_size: int, group_size: int) -> torch.Tensor:
    """x [L, H] as [blocks, block positions, groups, group channels]."""
    return x.reshape(-1, block_size, x.shape[1] // group_size, group_size)


def _earlier(blocks: torch.Tensor, tap: int) -> torch.Tensor:
    """Each block position's input `tap` positions back (zero before the block starts)."""
    return F.pad(blocks[:, : blocks.shape[1] - tap], (0, 0, 0, 0, tap, 0))


def _later(blocks: torch.Tensor, tap: int) -> torch.Tensor:
    """Each block position's value `tap` positions on (zero past the block's end)."""
    return F.pad(blocks[:, tap:], (0, 0, 0, 0, 0, tap))


def _forward_ops(x: torch.Tensor, delta: torch.Tensor, base: torch.Tensor, block_size: int):
    taps, groups = delta.shape[1], delta.shape[2]
    dtype = torch.promote_types(x.dtype, delta.dtype)
    blocks = _blocks(x, block_size, x.shape[1] // groups).to(dtype)
    corrections = delta.reshape(-1, block_size, taps, groups, 1).to(dtype)
    kernel = base.to(dtype).view(taps, groups, -1)
    out = (kernel[0] + corrections[:, :, 0]) * blocks
    for tap in range(1, taps):
        out = out + (kernel[tap] + corrections[:, :, tap]) * _earlier(blocks, tap)
    return out.reshape(x.shape)


def _backward_ops(
    grad: torch.Tensor, x: torch.Tensor, delta: torch.Tensor, base: torch.Tensor, block_size: int
):
    taps, groups = delta.shape[1], delta.shape[2]
    dtype = torch.promote_types(torch.promote_types(x.dtype, delta.dtype), torch.float32)
    blocks = _blocks(x, block_size, x.shape[1] // groups).to(dtype)
    grads = _blocks(grad, block_size, x.shape[1] // groups).to(dtype)
    corrections = delta.reshape(-1, block_size, taps, groups, 1).to(dtype)
    kernel = base.to(dtype).view(taps, groups, -1)
    grad_x = torch.zeros_like(blocks)
    grad_delta, grad_base = [], []
    for tap in range(taps):
        shifted = _later(grads * (kernel[tap] + corrections[:, :, tap]), tap) if tap else None
        grad_x = grad_x + (shifted if tap else grads * (kernel[0] + corrections[:, :, 0]))
        product = grads * (_earlier(blocks, tap) if tap else blocks)
        grad_delta.append(product.sum(-1))
        grad_base.append(product.sum((0, 1)).reshape(-1))
    return (
        grad_x.reshape(x.shape).to(x.dtype),
        torch.stack(grad_delta, 2).reshape(delta.shape).to(delta.dtype),
        torch.stack(grad_base).to(base.dtype),
    )


def _use_triton(x: torch.Tensor, delta: torch.Tensor) -> bool:
    group = x.shape[1] // delta.shape[2]
    return (
        x.is_cuda
        and x.dtype != torch.float64
        and delta.dtype != torch.float64
        and group & (group - 1) == 0
        and group <= TILE_CHANNELS
    )


@torch.library.custom_op("ringtrain::block_conv", mutates_args=())
def block_conv(
    x: torch.Tensor, delta: torch.Tensor, base: torch.Tensor, block_size: int
) -> torch.Tensor:
    """The convolution's output [L, H] (module docstring): x [L, H] whole blocks of
    `block_size`, delta [L, taps, groups], base [taps, H]."""
    if not _use_triton(x, delta):
        return _forward_ops(x, delta, base, block_size)
    out = x.new_empty(x.shape, dtype=torch.promote_types(x.dtype, delta.dtype))
    rows, hidden = x.shape
    taps, groups = delta.shape[1], delta.shape[2]
    grid = (-(-rows // TILE_ROWS), -(-hidden // TILE_CHANNELS))
    _kernels()[0][grid](
        x.contiguous(), delta.contiguous(), base.contiguous(), out, rows, hidden, groups,
        block_size, taps, hidden // groups, TILE_ROWS, TILE_CHANNELS,
    )  # fmt: skip
    return out


@block_conv.register_fake
def _(x: torch.Tensor, delta: torch.Tensor, base: torch.Tensor, block_size: int) -> torch.Tensor:
    return x.new_empty(x.shape, dtype=torch.promote_types(x.dtype, delta.dtype))


@torch.library.custom_op("ringtrain::block_conv_backward", mutates_args=())
def block_conv_backward(
    grad: torch.Tensor, x: torch.Tensor, delta: torch.Tensor, base: torch.Tensor, block_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, ddelta, dbase) of block_conv (module docstring) for the output's gradient."""
    if not _use_triton(x, delta):
        return _backward_ops(grad, x, delta, base, block_size)
    rows, hidden = x.shape
    taps, groups = delta.shape[1], delta.shape[2]
    grid = (-(-rows // TILE_ROWS), -(-hidden // TILE_CHANNELS))
    grad_x = x.new_empty(x.shape)
    grad_delta = delta.new_empty(delta.shape)
    partial = torch.empty((grid[0], taps, hidden), dtype=torch.float32, device=x.device)
    _kernels()[1][grid](
        grad.contiguous(), x.contiguous(), delta.contiguous(), base.contiguous(), grad_x,
        grad_delta, partial, rows, hidden, groups, block_size, taps, hidden // groups,
        TILE_ROWS, TILE_CHANNELS,
    )  # fmt: skip
    return grad_x, grad_delta, partial.sum(0).to(base.dtype)


@block_conv_backward.register_fake
def _(grad, x, delta, base, block_size):
    return x.new_empty(x.shape), delta.new_empty(delta.shape), base.new_empty(base.shape)


def _setup(ctx, inputs: tuple, output: torch.Tensor) -> None:
    x, delta, base, block_size = inputs
    ctx.save_for_backward(x, delta, base)
    ctx.block_size = block_size


def _backward(ctx, grad: torch.Tensor):
    x, delta, base = ctx.saved_tensors
    grad_x, grad_delta, grad_base = block_conv_backward(grad, x, delta, base, ctx.block_size)
    return grad_x, grad_delta, grad_base, None


block_conv.register_autograd(_backward, setup_context=_setup)


@functools.cache
def _kernels():
    """The forward and backward Triton kernels (imported on first CUDA use: CPU installs
    have no Triton)."""
    import triton
    import triton.language as tl

    @triton.jit
    def forward_kernel(
        x, delta, base, out, rows, hidden, groups, BLOCK: tl.constexpr, TAPS: tl.constexpr,
        GROUP: tl.constexpr, ROWS: tl.constexpr, CHANNELS: tl.constexpr,
    ):  # fmt: skip
        row = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        col = tl.program_id(1) * CHANNELS + tl.arange(0, CHANNELS)
        inside = (row[:, None] < rows) & (col[None, :] < hidden)
        position = row % BLOCK
        row64 = row.to(tl.int64)[:, None]
        group = (col // GROUP)[None, :]
        acc = tl.zeros((ROWS, CHANNELS), dtype=tl.float32)
        for tap in tl.static_range(TAPS):
            reach = inside & (position >= tap)[:, None]
            earlier = tl.load(x + (row64 - tap) * hidden + col[None, :], mask=reach, other=0.0)
            correction = tl.load(
                delta + row64 * (TAPS * groups) + tap * groups + group, mask=reach, other=0.0
            )
            weight = tl.load(base + tap * hidden + col, mask=col < hidden, other=0.0)
            acc += (weight[None, :] + correction.to(tl.float32)) * earlier.to(tl.float32)
        tl.store(out + row64 * hidden + col[None, :], acc.to(out.dtype.element_ty), mask=inside)

    @triton.jit
    def backward_kernel(
        grad, x, delta, base, grad_x, grad_delta, partial, rows, hidden, groups,
        BLOCK: tl.constexpr, TAPS: tl.constexpr, GROUP: tl.constexpr, ROWS: tl.constexpr,
        CHANNELS: tl.constexpr,
    ):  # fmt: skip
        row = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
        col = tl.program_id(1) * CHANNELS + tl.arange(0, CHANNELS)
        inside = (row[:, None] < rows) & (col[None, :] < hidden)
        position = row % BLOCK
        row64 = row.to(tl.int64)[:, None]
        group = (col // GROUP)[None, :]
        own = tl.load(grad + row64 * hidden + col[None, :], mask=inside, other=0.0).to(tl.float32)
        acc = tl.zeros((ROWS, CHANNELS), dtype=tl.float32)
        tile_group = tl.program_id(1) * (CHANNELS // GROUP) + tl.arange(0, CHANNELS // GROUP)
        for tap in tl.static_range(TAPS):
            # dx: the outputs `tap` positions on read this input through tap `tap`.
            ahead = inside & (position + tap < BLOCK)[:, None]
            later = tl.load(grad + (row64 + tap) * hidden + col[None, :], mask=ahead, other=0.0)
            correction = tl.load(
                delta + (row64 + tap) * (TAPS * groups) + tap * groups + group,
                mask=ahead,
                other=0.0,
            )
            weight = tl.load(base + tap * hidden + col, mask=col < hidden, other=0.0)
            acc += (weight[None, :] + correction.to(tl.float32)) * later.to(tl.float32)
            # ddelta and dbase: this output times the input `tap` positions back.
            reach = inside & (position >= tap)[:, None]
            earlier = tl.load(x + (row64 - tap) * hidden + col[None, :], mask=reach, other=0.0)
            product = own * earlier.to(tl.float32)
            by_group = tl.sum(tl.reshape(product, (ROWS, CHANNELS // GROUP, GROUP)), axis=2)
            tl.store(
                grad_delta + row64 * (TAPS * groups) + tap * groups + tile_group[None, :],
                by_group.to(grad_delta.dtype.element_ty),
                mask=(row[:, None] < rows) & (tile_group[None, :] < groups),
            )
            tl.store(
                partial + (tl.program_id(0) * TAPS + tap) * hidden + col,
                tl.sum(product, axis=0),
                mask=col < hidden,
            )
        tl.store(
            grad_x + row64 * hidden + col[None, :], acc.to(grad_x.dtype.element_ty), mask=inside
        )

    return forward_kernel, backward_kernel
