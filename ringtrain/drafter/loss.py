"""Weighted cross-entropy through the frozen LM head, chunked so logits never exist in full.

Rows go through `hidden @ lm_head.T` a chunk at a time; forward keeps only each row's
log-sum-exp and whether its argmax equals the label; backward recomputes each chunk's
logits (one extra LM-head matmul) to form the gradient with respect to the hidden states.
Memory therefore scales with the chunk, not with anchors x vocabulary. The LM head is
frozen: no gradient is produced for it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def _logits(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """fp32 logits for bf16/fp32 inputs, fp64 for fp64 inputs."""
    return (hidden @ weight.t()).to(torch.promote_types(hidden.dtype, torch.float32))


def chunk_forward(
    hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, row_weights: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One chunk: (sum of row_weights * CE, per-row log-sum-exp, per-row argmax == label)."""
    logits = _logits(hidden, weight)
    lse = torch.logsumexp(logits, dim=-1)
    target = logits.gather(1, labels[:, None]).squeeze(1)
    loss = ((lse - target) * row_weights.to(lse.dtype)).sum()
    return loss, lse, logits.argmax(-1) == labels


def chunk_backward(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    row_weights: torch.Tensor,
    lse: torch.Tensor,
    grad_loss: torch.Tensor,
) -> torch.Tensor:
    """Gradient of grad_loss * chunk loss with respect to the chunk's hidden rows."""
    logits = _logits(hidden, weight)
    probs = torch.exp(logits - lse[:, None])
    probs = probs.scatter_add(1, labels[:, None], -torch.ones_like(lse)[:, None])
    scale = (row_weights.to(lse.dtype) * grad_loss.to(lse.dtype))[:, None]
    return (probs * scale).to(hidden.dtype) @ weight


class ChunkFns:
    """The per-chunk forward/backward kernels (eager, or compiled once for static shapes)."""

    def __init__(self, compile_mode: str | None = None) -> None:
        self.forward: Callable = chunk_forward
        self.backward: Callable = chunk_backward
        if compile_mode is not None:
            self.forward = torch.compile(chunk_forward, mode=compile_mode, dynamic=False)
            self.backward = torch.compile(chunk_backward, mode=compile_mode, dynamic=False)


class _ChunkedHeadLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, labels, row_weights, chunk, fns):
        loss = hidden.new_zeros((), dtype=torch.promote_types(hidden.dtype, torch.float32))
        lse = torch.empty(hidden.shape[0], dtype=loss.dtype, device=hidden.device)
        correct = torch.empty(hidden.shape[0], dtype=torch.bool, device=hidden.device)
        for start in range(0, hidden.shape[0], chunk):
            part = slice(start, start + chunk)
            loss_c, lse[part], correct[part] = fns.forward(
                hidden[part], weight, labels[part], row_weights[part]
            )
            loss = loss + loss_c
        ctx.save_for_backward(hidden, weight, labels, row_weights, lse)
        ctx.chunk, ctx.fns = chunk, fns
        ctx.mark_non_differentiable(correct)
        return loss, correct

    @staticmethod
    def backward(ctx, grad_loss, _grad_correct):
        hidden, weight, labels, row_weights, lse = ctx.saved_tensors
        grad = torch.empty_like(hidden)
        for start in range(0, hidden.shape[0], ctx.chunk):
            part = slice(start, start + ctx.chunk)
            grad[part] = ctx.fns.backward(
                hidden[part], weight, labels[part], row_weights[part], lse[part], grad_loss
            )
        return grad, None, None, None, None, None


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
