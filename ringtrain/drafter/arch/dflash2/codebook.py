"""Rows of a token codebook by index: a lookup the compiler can fuse, and a backward that
stays aten's under torch.compile.

The selector looks up codebook rows for every candidate of every slot (a million lookups
of a few thousand distinct tokens per step on a small drafter). Forward, `codebook_rows`
is a plain embedding lookup, so a compiled graph reads the rows inside the kernel that
consumes them (the selector's product over the rank) instead of writing them out first.
Backward, aten's embedding backward sorts the indices and sums each token's rows once;
Inductor instead decomposes it into an accumulating scatter, whose atomic adds collide
on the common tokens (5.6 ms against about 1 ms per step on the real recipe's drafter,
H200), so the gradient goes through an opaque custom op that calls aten's kernel.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


@torch.library.custom_op("ringtrain::codebook_grad", mutates_args=())
def codebook_grad(grad: torch.Tensor, indices: torch.Tensor, num_rows: int) -> torch.Tensor:
    """The codebook's gradient [num_rows, R] from its rows' gradients grad [..., R]."""
    return torch.ops.aten.embedding_dense_backward(grad, indices, num_rows, -1, False)


@codebook_grad.register_fake
def _codebook_grad_shape(grad: torch.Tensor, indices: torch.Tensor, num_rows: int) -> torch.Tensor:
    return grad.new_empty((num_rows, grad.shape[-1]))


class _CodebookRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, indices: torch.Tensor, codebook: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(indices)
        ctx.num_rows = codebook.shape[0]
        return F.embedding(indices, codebook)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[None, torch.Tensor]:
        (indices,) = ctx.saved_tensors
        return None, codebook_grad(grad.contiguous(), indices, ctx.num_rows)


def codebook_rows(indices: torch.Tensor, codebook: torch.Tensor) -> torch.Tensor:
    """codebook[indices] ([..., R]), with aten's embedding backward when compiled."""
    return _CodebookRows.apply(indices, codebook)
