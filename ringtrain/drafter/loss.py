"""Weighted cross-entropy through the frozen LM head, chunked so logits never exist in full.

Rows go through `hidden @ lm_head.T` a chunk at a time. The loss is a scalar sum, so its
gradient with respect to the hidden rows is `grad_output * G` with G known as soon as the
chunk's logits are: the forward pass computes G per chunk right away (softmax minus
one-hot, times the row weights, back through the LM head) and drops the logits, and
backward only scales G. Memory therefore scales with the chunk, not with anchors x
vocabulary, and the LM head matmul is never recomputed. When no gradient is needed
(evaluation), G is skipped. The LM head is frozen: no gradient is produced for it.

Row weights are either given (the decayed cross-entropy: fixed per block slot) or made
from the chunk's own cross-entropy by a `Reweight` (D-PACE, see `dpace_weights`); made
weights are detached, so G keeps its form. Then every chunk holds whole blocks.

With ``top_k`` set, each chunk also hands over its rows' top-k token ids and their
logits, taken from the logits it forms anyway (DFlash2's candidate selector trains on
them: the same values its decoding walk ranks), so no caller forms vocabulary-wide logits,
or the candidates' logits, a second time.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import torch

from ringtrain.drafter.row_topk import row_topk

# (cross-entropy [rows], given row weights [rows]) -> the row weights used; no gradient.
Reweight = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def given_weights(_ce: torch.Tensor, row_weights: torch.Tensor) -> torch.Tensor:
    """The decayed cross-entropy's weights: the given ones, unchanged."""
    return row_weights


def dpace_weights(ce: torch.Tensor, scored: torch.Tensor, alpha: float, slots: int) -> torch.Tensor:
    """D-PACE position weights for rows laid out as whole blocks of ``slots`` rows.

    With q_k = exp(-CE_k) the drafter's probability of the label at slot k and
    s_k = alpha + (1 - alpha) * q_k (1 at unscored slots, so they pass through), the
    chance that decoding still runs at slot m is R_m = s_1 * ... * s_m, and slot k's
    weight is the expected run length from k on: w_k = R_k + R_{k+1} + ... (scored
    slots only); 0 at unscored slots. ``scored`` is 1 on scored rows, 0 elsewhere.
    """
    scored = scored.view(-1, slots)
    smoothed = torch.where(scored > 0, alpha + (1.0 - alpha) * torch.exp(-ce.view(-1, slots)), 1.0)
    reach = torch.cumprod(smoothed, dim=1) * scored
    from_here = reach.sum(1, keepdim=True) - reach.cumsum(1) + reach
    return (from_here * scored).reshape(-1)


def _logits(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """fp32 logits for bf16/fp32 inputs, fp64 for fp64 inputs."""
    return (hidden @ weight.t()).to(torch.promote_types(hidden.dtype, torch.float32))


# Vocabulary entries per group in `top_ids`' first pass.
TOP_K_GROUP = 64


def _groups(logits: torch.Tensor) -> torch.Tensor:
    """The logits as [rows, groups, entries]: runs of TOP_K_GROUP consecutive entries (of the
    largest size dividing the vocabulary)."""
    rows, vocab = logits.shape
    group = math.gcd(vocab, TOP_K_GROUP)
    return logits.view(rows, vocab // group, group)


def grouped_lse(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(the groups' maxima, the rows' log-sum-exp) in one read of the logits: the
    log-sum-exp through each group's own, shifted by the group's maximum."""
    groups = _groups(logits)
    maxima = groups.amax(-1)
    # A constant shift (no gradient through it); 0 for a group with no finite entry.
    shift = torch.where(torch.isfinite(maxima), maxima, torch.zeros_like(maxima)).detach()
    group_lse = shift + torch.log(torch.exp(groups - shift[..., None]).sum(-1))
    return maxima, torch.logsumexp(group_lse, dim=-1)


def grouped_argmax(logits: torch.Tensor, maxima: torch.Tensor) -> torch.Tensor:
    """The rows' argmax (the first of equal largest entries, as torch.argmax's) from the
    groups' maxima: the first largest entry of the first group holding the row's maximum."""
    groups = _groups(logits)
    best = maxima.argmax(-1)
    entries = groups.gather(1, best[:, None, None].expand(-1, 1, groups.shape[2])).squeeze(1)
    return best * groups.shape[2] + entries.argmax(-1)


class _ScoredChunk(NamedTuple):
    logits: torch.Tensor
    lse: torch.Tensor  # the rows' log-sum-exp
    scale: torch.Tensor  # the row weights used
    loss: torch.Tensor  # sum of weights * CE
    correct: torch.Tensor  # argmax == label
    top_ids: torch.Tensor  # [rows, top_k]
    top_logits: torch.Tensor  # [rows, top_k]: their logits


def _score_chunk(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    row_weights: torch.Tensor,
    reweight: Reweight,
    top_k: int,
) -> _ScoredChunk:
    """One chunk's logits and what is read off them. The log-sum-exp comes with the groups'
    maxima (`grouped_lse`), from which the rows' top ids and argmax follow without
    another pass over the logits (with top_k, a row's argmax is its top id: of equal
    largest entries, the one top_ids ranks first)."""
    logits = _logits(hidden, weight)
    maxima, lse = grouped_lse(logits)
    ids = top_ids(logits, top_k, maxima)
    correct = (ids[:, 0] if top_k else grouped_argmax(logits, maxima)) == labels
    ce = lse - logits.gather(1, labels[:, None]).squeeze(1)
    scale = reweight(ce.detach(), row_weights.to(lse.dtype))
    top_logits = logits.detach().gather(1, ids)
    return _ScoredChunk(logits, lse, scale, (ce * scale).sum(), correct, ids, top_logits)


def top_ids(logits: torch.Tensor, top_k: int, maxima: torch.Tensor) -> torch.Tensor:
    """The rows' top_k token ids, largest first ([rows, 0] when top_k is 0); ``maxima``: the
    groups' maxima (`grouped_lse`).

    In two passes, exact up to the order of ties: the top_k groups of TOP_K_GROUP
    consecutive entries by their largest entry hold every one of the row's top_k entries
    (an entry outside them is beaten by those groups' maxima, top_k entries). The first
    pass ranks the groups' maxima (read off with the log-sum-exp); the second ranks
    top_k * TOP_K_GROUP gathered entries; both rank short rows in one kernel each
    (`row_topk`). A vocabulary-wide top-k instead runs a radix select over every row
    (about a fifth of a small drafter's step)."""
    rows, vocab = logits.shape
    if not top_k:
        return logits.new_empty((rows, 0), dtype=torch.long)
    logits = logits.detach()
    group = vocab // maxima.shape[1]
    first = row_topk(maxima.detach(), min(top_k, maxima.shape[1]))
    ids = (first[:, :, None] * group + torch.arange(group, device=logits.device)).view(rows, -1)
    return ids.gather(1, row_topk(logits.gather(1, ids), top_k))


def chunk_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    row_weights: torch.Tensor,
    reweight: Reweight = given_weights,
    top_k: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One chunk: (sum of weights * CE, per-row argmax == label, top_k ids per row, their
    logits)."""
    scored = _score_chunk(hidden, weight, labels, row_weights, reweight, top_k)
    return scored.loss, scored.correct, scored.top_ids, scored.top_logits


def chunk_loss_and_grad(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    row_weights: torch.Tensor,
    reweight: Reweight = given_weights,
    top_k: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """chunk_loss plus the gradient of the chunk's loss with respect to its hidden rows."""
    logits, lse, scale, loss, correct, ids, top_logits = _score_chunk(
        hidden, weight, labels, row_weights, reweight, top_k
    )
    vocab = torch.arange(logits.shape[1], device=logits.device)
    one_hot = vocab[None, :] == labels[:, None]
    grad_logits = (torch.exp(logits - lse[:, None]) - one_hot.to(lse.dtype)) * scale[:, None]
    return loss, correct, ids, top_logits, grad_logits.to(hidden.dtype) @ weight


class ChunkFns:
    """The per-chunk kernels (eager, or compiled once for their static shapes).

    ``reweight`` makes the row weights from the chunk's cross-entropy (default: the given
    weights); ``group`` rows (one block's scored slots) always share a chunk; ``top_k``
    (0: none) token ids per row are handed over beside the loss.
    """

    def __init__(
        self,
        compile_mode: str | None = None,
        reweight: Reweight = given_weights,
        group: int = 1,
        top_k: int = 0,
    ) -> None:
        self.group = group
        self.top_k = top_k
        self.loss: Callable = partial(chunk_loss, reweight=reweight, top_k=top_k)
        self.loss_and_grad: Callable = partial(chunk_loss_and_grad, reweight=reweight, top_k=top_k)
        if compile_mode is not None:
            self.loss = torch.compile(self.loss, mode=compile_mode, dynamic=False)
            self.loss_and_grad = torch.compile(self.loss_and_grad, mode=compile_mode, dynamic=False)


class _ChunkedHeadLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, labels, row_weights, chunk, fns):
        loss = hidden.new_zeros((), dtype=torch.promote_types(hidden.dtype, torch.float32))
        correct = torch.empty(hidden.shape[0], dtype=torch.bool, device=hidden.device)
        candidates = labels.new_empty((hidden.shape[0], fns.top_k))
        candidate_logits = loss.new_empty((hidden.shape[0], fns.top_k))
        need_grad = ctx.needs_input_grad[0]
        grad = torch.empty_like(hidden) if need_grad else None
        for start in range(0, hidden.shape[0], chunk):
            part = slice(start, start + chunk)
            args = (hidden[part], weight, labels[part], row_weights[part])
            if need_grad:
                loss_c, correct[part], candidates[part], candidate_logits[part], grad[part] = (
                    fns.loss_and_grad(*args)
                )
            else:
                loss_c, correct[part], candidates[part], candidate_logits[part] = fns.loss(*args)
            loss = loss + loss_c
        if need_grad:
            ctx.save_for_backward(grad)
        ctx.mark_non_differentiable(correct, candidates, candidate_logits)
        return loss, correct, candidates, candidate_logits

    @staticmethod
    def backward(ctx, grad_loss, _grad_correct, _grad_top_ids, _grad_top_logits):
        (grad,) = ctx.saved_tensors
        return grad * grad_loss.to(grad.dtype), None, None, None, None, None


class HeadLoss(NamedTuple):
    """chunked_head_loss's result."""

    # sum over rows of row_weights * CE(hidden @ weight.T, labels)
    loss: torch.Tensor
    # argmax == label, per row
    correct: torch.Tensor
    # [rows, fns.top_k] token ids of each row's largest logits ([rows, 0] without top_k)
    top_ids: torch.Tensor
    # [rows, fns.top_k] their logits (no gradient)
    top_logits: torch.Tensor


def chunked_head_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    row_weights: torch.Tensor,
    chunk: int,
    fns: ChunkFns | None = None,
) -> HeadLoss:
    """The weighted cross-entropy of the rows through the head, chunk by chunk (HeadLoss).

    Rows are split into equal chunks of about `chunk` rows, each a whole number of
    ``fns.group`` rows (the tail is padded with zero-weight rows), so a compiled chunk
    kernel sees one shape only.
    """
    fns = fns or ChunkFns()
    rows = hidden.shape[0]
    num_chunks = max(1, -(-rows // chunk))
    chunk = -(-rows // num_chunks)
    chunk = -(-chunk // fns.group) * fns.group
    num_chunks = max(1, -(-rows // chunk))
    pad = num_chunks * chunk - rows
    if pad:
        hidden = torch.cat((hidden, hidden.new_zeros(pad, hidden.shape[1])))
        labels = torch.cat((labels, labels.new_zeros(pad)))
        row_weights = torch.cat((row_weights, row_weights.new_zeros(pad)))
    loss, correct, candidates, candidate_logits = _ChunkedHeadLoss.apply(
        hidden, weight, labels, row_weights, chunk, fns
    )
    return HeadLoss(loss, correct[:rows], candidates[:rows], candidate_logits[:rows])
