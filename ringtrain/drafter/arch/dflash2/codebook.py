"""Rows of a token codebook by index, with a backward that stays aten's under torch.compile.

The selector looks up codebook rows for every candidate of every slot (a million lookups
of a few thousand distinct tokens per step on a small drafter). aten's embedding backward
sorts the indices and sums each token's rows once; Inductor instead decomposes it into an
accumulating scatter, whose atomic adds collide on the common tokens (5.6 ms against about
1 ms per step on the real recipe's drafter, H200). `codebook_rows` is F.embedding whose
gradient is an opaque custom op, so compiled graphs call aten's kernel for it.
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


def _backward(ctx, grad: torch.Tensor) -> tuple[None, torch.Tensor]:
    (indices,) = ctx.saved_tensors
    return None, codebook_grad(grad.contiguous(), indices, ctx.num_rows)


def _save(ctx, inputs: tuple[torch.Tensor, torch.Tensor], output: torch.Tensor) -> None:
    indices, codebook = inputs
    ctx.save_for_backward(indices)
    ctx.num_rows = codebook.shape[0]


@torch.library.custom_op("ringtrain::codebook_rows", mutates_args=())
def codebook_rows(indices: torch.Tensor, codebook: torch.Tensor) -> torch.Tensor:
    """codebook[indices] ([..., R]), as F.embedding, with aten's backward when compiled."""
    return F.embedding(indices, codebook)


@codebook_rows.register_fake
def _codebook_rows_shape(indices: torch.Tensor, codebook: torch.Tensor) -> torch.Tensor:
    return codebook.new_empty((*indices.shape, codebook.shape[-1]))


codebook_rows.register_autograd(_backward, setup_context=_save)
