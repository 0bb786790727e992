"""Weighted cross-entropy through the frozen LM head, chunked so logits never exist in full.

Rows go through `hidden @ lm_head.T` a chunk at a time. The loss is a scalar sum, so its
gradient with respect to the hidden rows is `grad_output * G` with G known as soon as the
chunk's logits are: the forward pass computes G per chunk right away (softmax minus
one-hot, times the row weights, back through the LM head) and drops the logits, and
backward only scales G. Memory therefore scales with the chunk, not with anchors x
vocabulary, and the LM head matmul is never recomputed. When no gradient is needed
(evaluation), G is skipped. The LM head is frozen: no gradient is produced for it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def _logits(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """fp32 logits for bf16/fp32 inputs, fp64 for fp64 inputs."""
    return (hidden @ weight.t()).to(torch.promote_types(hidden.dtype, torch.float32))


def chunk_loss(
    hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, row_weights: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk: (sum of row_weights * CE, per-row argmax == label)."""
    logits = _logits(hidden, weight)
    lse = torch.logsumexp(logits, dim=-1)
    target = logits.gather(1, labels[:, None]).squeeze(1)
    loss = ((lse - target) * row_weights.to(lse.dtype)).sum()
    return loss, logits.argmax(-1) == labels


def chunk_loss_and_grad(
    hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, row_weights: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """chunk_loss plus the gradient of the chunk's loss with respect to its hidden rows."""
    logits = _logits(hidden, weight)
    lse = torch.logsumexp(logits, dim=-1)
    target = logits.gather(1, labels[:, None]).squeeze(1)
    scale = row_weights.to(lse.dtype)
    loss = ((lse - target) * scale).sum()
    vocab = torch.arange(logits.shape[1], device=logits.device)
    one_hot = vocab[None, :] == labels[:, None]
    grad_logits = (torch.exp(logits - lse[:, None]) - one_hot.to(lse.dtype)) * scale[:, None]
    return loss, logits.argmax(-1) == labels, grad_logits.to(hidden.dtype) @ weight


class ChunkFns:
    """The per-chunk kernels (eager, or compiled once for their static shapes)."""

    def __init__(self, compile_mode: str | None = None) -> None:
        self.loss: Callable = chunk_loss
        self.loss_and_grad: Callable = chunk_loss_and_grad
        if compile_mode is not None:
            self.loss = torch.compile(chunk_loss, mode=compile_mode, dynamic=False)
            self.loss_and_grad = torch.compile(
                chunk_loss_and_grad, mode=compile_mode, dynamic=False
            )


class _ChunkedHeadLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, labels, row_weights, chunk, fns):
        loss = hidden.new_zeros((), dtype=torch.promote_types(hidden.dtype, torch.float32))
        correct = torch.empty(hidden.shape[0], dtype=torch.bool, device=hidden.device)
        need_grad = ctx.needs_input_grad[0]
        grad = torch.empty_like(hidden) if need_grad else None
        for start in range(0, hidden.shape[0], chunk):
            part = slice(start, start + chunk)
            args = (hidden[part], weight, labels[part], row_weights[part])
            if need_grad:
                loss_c, correct[part], grad[part] = fns.loss_and_grad(*args)
            else:
                loss_c, correct[part] = fns.loss(*args)
            loss = loss + loss_c
        if need_grad:
            ctx.save_for_backward(grad)
        ctx.mark_non_differentiable(correct)
        return loss, correct

    @staticmethod
    def backward(ctx, grad_loss, _grad_correct):
        (grad,) = ctx.saved_tensors
        return grad * grad_loss.to(grad.dtype), None, None, None, None, None


def chunked_head_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    row_weights: torch.Tensor,
    chunk: int,
    fns: ChunkFns | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum over rows of row_weights * CE(hidden @ weight.T, labels), argmax == label per row).

    Rows are split into equal chunks of at most `chunk` rows (the tail is padded with
    zero-weight rows), so a compiled chunk kernel sees one shape only.
    """
    rows = hidden.shape[0]
    num_chunks = max(1, -(-rows // chunk))
    chunk = -(-rows // num_chunks)
    pad = num_chunks * chunk - rows
    if pad:
        hidden = torch.cat((hidden, hidden.new_zeros(pad, hidden.shape[1])))
        labels = torch.cat((labels, labels.new_zeros(pad)))
        row_weights = torch.cat((row_weights, row_weights.new_zeros(pad)))
    loss, correct = _ChunkedHeadLoss.apply(
        hidden, weight, labels, row_weights, chunk, fns or ChunkFns()
    )
    return loss, correct[:rows]
