"""DFlash2's candidate selector: its proposal rule (a greedy walk through each slot's top-k
candidates), and its part of the block objective (the selector's cross-entropy over those
candidates, added to the loss and reported apart as selector_loss).

Instead of each slot's argmax, the drafter keeps each slot's top-k tokens and walks
greedily from the last accepted token, scoring candidate ``b`` after predecessor ``a`` as
``logit(b) + <A[a] * P(h), B[b]>`` (``A``, ``B``: token codebooks ``[V, rank]``; ``P``: a
projection of the slot's final hidden state). It starts as a no-op (zero successor
codebook), so a fresh selector walks through each slot's argmax.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from ringtrain.drafter.arch.dflash.model import INIT_STD
from ringtrain.drafter.arch.dflash2.codebook import codebook_rows
from ringtrain.drafter.config import DrafterConfig
from ringtrain.drafter.spec import DrafterSpec
from ringtrain.drafter.sums import LOSS_PART, ObjectiveSums
from ringtrain.generate.sampling import TokenSampler, race


class CandidateSelector(nn.Module):
    """Scores a slot's top-k candidates after a predecessor token (low-rank bilinear)."""

    def __init__(self, spec: DrafterSpec) -> None:
        super().__init__()
        self.top_k = spec.settings.selector_top_k
        self.predecessor_codebook = nn.Parameter(
            torch.empty(spec.vocab_size, spec.settings.selector_rank)
        )
        self.successor_codebook = nn.Parameter(
            torch.empty(spec.vocab_size, spec.settings.selector_rank)
        )
        self.hidden_projection = nn.Linear(
            spec.hidden_size, spec.settings.selector_rank, bias=False
        )

    def reset_parameters(self) -> None:
        """No-op start: the successor codebook zero (every score is the slot's logit)."""
        with torch.no_grad():
            self.predecessor_codebook.normal_(std=INIT_STD)
            self.successor_codebook.zero_()
            self.hidden_projection.weight.normal_(std=INIT_STD)

    def _projected(
        self, hidden: torch.Tensor
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """The projected rows [..., rank] and the (predecessor, successor) codebooks in
        their dtype (bf16 under autocast), as `_projected_scores` takes them."""
        projected = self.hidden_projection(hidden.to(self.hidden_projection.weight.dtype))
        dtype = projected.dtype
        return projected, (self.predecessor_codebook.to(dtype), self.successor_codebook.to(dtype))

    def scores(
        self,
        hidden: torch.Tensor,
        unary: torch.Tensor,
        candidates: torch.Tensor,
        predecessors: torch.Tensor,
    ) -> torch.Tensor:
        """hidden [..., H], unary and candidates [..., k], predecessors [...] -> [..., k]."""
        return self._projected_scores(*self._projected(hidden), unary, candidates, predecessors)

    def _projected_scores(
        self,
        projected: torch.Tensor,
        codebooks: tuple[torch.Tensor, torch.Tensor],
        unary: torch.Tensor,
        candidates: torch.Tensor,
        predecessors: torch.Tensor,
    ) -> torch.Tensor:
        """`scores` from the projected rows and codebooks `_projected` gave: a walk projects
        all its slots and casts the codebooks once, then scores the slots one at a time."""
        # Codebook rows by a lookup whose backward is aten's embedding backward, made for
        # many repeats of a few rows (common tokens fill most candidate lists): see
        # codebook.py. They are read from copies in the projection's dtype (bf16 under
        # autocast): the successors' rows are rows x top_k x rank, a gigabyte a step in
        # float32 on a small drafter. The pair product is a multiply and a sum, not a
        # batched matmul of [top_k, rank] by [rank] per row, so a compiled graph reads
        # the successors' rows inside its reduction instead of writing them out first;
        # the sum runs in float32 at least.
        predecessor_codebook, successor_codebook = codebooks
        gate = codebook_rows(predecessors, predecessor_codebook) * projected
        successors = codebook_rows(candidates, successor_codebook)
        accumulate = torch.promote_types(projected.dtype, torch.float32)
        pair = (gate[..., None, :].to(accumulate) * successors.to(accumulate)).sum(-1)
        return unary + pair.to(unary.dtype)

    def walk(
        self, hidden: torch.Tensor, logits: torch.Tensor, anchor: torch.Tensor
    ) -> torch.Tensor:
        """Greedy path [S] through slots hidden [S, H] / logits [S, V] after token `anchor`.

        Every index stays a one-element device tensor (a 0-d tensor index is read on the
        host), so the walk runs without a host sync and a CUDA graph can hold it."""
        unary, candidates = logits.topk(self.top_k, dim=-1)
        projected, codebooks = self._projected(hidden)
        path = []
        predecessor = anchor.reshape(1)
        for slot in range(hidden.shape[0]):
            row = slice(slot, slot + 1)
            slot_scores = self._projected_scores(
                projected[row], codebooks, unary[row], candidates[row], predecessor
            )
            predecessor = candidates[row].gather(-1, slot_scores.argmax(-1, keepdim=True))[:, 0]
            path.append(predecessor)
        return torch.cat(path)

    def sampled_walk(
        self,
        hidden: torch.Tensor,
        logits: torch.Tensor,
        anchor: torch.Tensor,
        sampler: TokenSampler,
        noise: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``walk`` with each step drawn among the slot's top-k candidates from
        softmax(scores / T) within top-p after the token drawn before it, by the
        exponential race over ``noise`` [S, >= top_k]; returns (path [S], q [S, V]: each
        slot's distribution over its candidates, zero elsewhere). No host sync."""
        unary, candidates = logits.topk(self.top_k, dim=-1)
        q = torch.zeros_like(logits, dtype=torch.float32)
        projected, codebooks = self._projected(hidden)
        predecessor = anchor.reshape(1)
        path = []
        for slot in range(hidden.shape[0]):
            row = slice(slot, slot + 1)
            slot_scores = self._projected_scores(
                projected[row], codebooks, unary[row], candidates[row], predecessor
            )
            local = sampler.probabilities(slot_scores)
            choice = race(local, noise[row, : self.top_k])
            predecessor = candidates[row].gather(-1, choice[:, None])[:, 0]
            q[row] = q[row].scatter(-1, candidates[row], local)
            path.append(predecessor)
        return torch.cat(path), q


# One chunk of rows: (selector, rows, lm_head, candidates, candidate_logits, predecessors,
# targets, weights) -> (weighted loss sum, the walk's pick per row); see selector_chunk.
SelectorChunk = Callable[..., tuple[torch.Tensor, torch.Tensor]]


class _CandidateLogits(torch.autograd.Function):
    """The candidates' logits [rows, k] as the head's chunked loss formed them (the values
    the decoding walk ranks), with their gradient for the rows [rows, H]: each candidate's
    LM-head row, gathered in backward (rows x k x H, the size of k copies of the hidden
    states, is not kept)."""

    @staticmethod
    def forward(
        ctx,
        rows: torch.Tensor,
        lm_head: torch.Tensor,
        candidates: torch.Tensor,
        candidate_logits: torch.Tensor,
    ):
        ctx.save_for_backward(lm_head, candidates)
        ctx.rows_dtype = rows.dtype
        return candidate_logits.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        lm_head, candidates = ctx.saved_tensors
        # A sum of top_k gathered [rows, H] terms, not a reduction over a [rows, top_k, H]
        # gather: compiled, each output element reads its top_k LM-head entries with the
        # hidden dimension contiguous (whole rows of the head at a time).
        grad_rows = sum(
            grad[:, k, None] * lm_head[candidates[:, k]].to(grad.dtype)
            for k in range(candidates.shape[1])
        )
        return grad_rows.to(ctx.rows_dtype), None, None, None


def selector_chunk(
    selector: CandidateSelector,
    rows: torch.Tensor,
    lm_head: torch.Tensor,
    candidates: torch.Tensor,
    candidate_logits: torch.Tensor,
    predecessors: torch.Tensor,
    targets: torch.Tensor,
    weights: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """selector_loss_sum over one chunk of rows: (sum of weights * CE, the walk's pick)."""
    unary = _CandidateLogits.apply(rows, lm_head, candidates, candidate_logits)
    scores = selector.scores(rows, unary, candidates, predecessors)
    hits = candidates == targets[:, None]
    loss = F.cross_entropy(scores, hits.long().argmax(-1), reduction="none")
    picked = candidates.gather(-1, scores.detach().argmax(-1, keepdim=True)).squeeze(-1)
    return (loss * weights * hits.any(-1)).sum(), picked


def selector_loss_sum(
    selector: CandidateSelector,
    rows: torch.Tensor,
    lm_head: torch.Tensor,
    labels: torch.Tensor,
    row_weights: torch.Tensor,
    candidates: torch.Tensor,
    candidate_logits: torch.Tensor,
    chunk: int,
    chunk_fn: SelectorChunk = selector_chunk,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of row_weights * CE of the selector over each scored slot's top-k candidates,
    whether the walk picks each slot's true token).

    rows [A * (B-1), H] are the final hidden states of slots 1..B-1, labels [A, B] the true
    tokens of slots 0..B-1 (slot 0: the anchor), row_weights [A, B-1] and candidates
    [A * (B-1), top_k] each row's top-k tokens by logit and candidate_logits their logits
    (chunked_head_loss hands both over from the logits it forms for the cross-entropy). Slot k is
    scored after its true predecessor (the label of slot k - 1, as the walk would have it had
    every earlier slot been right) and labelled with its true token's index among the
    candidates; a slot whose true token misses the top-k adds nothing. The second result
    [A * (B-1)] is the walk's proposal rule under the same teacher forcing: slot k's best
    scored candidate is its true token. A block's leading run of those is exactly the
    prefix `walk` gets accepted. `chunk` rows are scored at a time by `chunk_fn`
    (selector_chunk, or a compiled copy of it).
    """
    predecessors = labels[:, :-1].reshape(-1)
    targets = labels[:, 1:].reshape(-1)
    weights = row_weights.reshape(-1)
    total = rows.new_zeros((), dtype=torch.promote_types(lm_head.dtype, torch.float32))
    picked = []
    for start in range(0, rows.shape[0], chunk):
        part = slice(start, start + chunk)
        loss, pick = chunk_fn(
            selector, rows[part], lm_head, candidates[part], candidate_logits[part],
            predecessors[part], targets[part], weights[part],
        )  # fmt: skip
        total = total + loss
        picked.append(pick)
    return total, torch.cat(picked) == targets


@dataclass(frozen=True)
class SelectorSums(ObjectiveSums):
    """ObjectiveSums of a DFlash2 batch: the selector's part of the loss beside the rest."""

    # The selector's (weighted) cross-entropy within loss_sum, reported apart as
    # selector_loss because it can grow as more true tokens reach the candidates.
    selector_loss_sum: torch.Tensor = field(metadata=LOSS_PART)


class SelectorTerm:
    """DFlash2's block term (drafter/arch/base.py's BlockTerm): the walk's hits under
    teacher forcing, and the selector's cross-entropy times drafter.selector_loss_weight."""

    def __init__(self, drafter: nn.Module, cfg: DrafterConfig, compile_mode: str | None) -> None:
        self.selector: CandidateSelector = drafter.candidate_selector
        self.top_k = self.selector.top_k
        self.weight = cfg.selector_loss_weight
        self.chunk_fn: SelectorChunk = selector_chunk
        # Eager, the candidates' LM-head rows of a chunk are gathered whole (rows x top_k x
        # H floats), so rows go `chunk` at a time. Compiled, the gather fuses into its
        # product (nothing of that size exists) and all rows go at once: per chunk, the
        # codebooks' backward would scatter into a vocabulary-wide gradient of its own.
        self.whole_batch = compile_mode is not None
        if self.whole_batch:
            self.chunk_fn = torch.compile(selector_chunk, mode=compile_mode, dynamic=False)

    def __call__(
        self,
        rows: torch.Tensor,
        lm_head: torch.Tensor,
        labels: torch.Tensor,
        row_weights: torch.Tensor,
        candidates: torch.Tensor,
        candidate_logits: torch.Tensor,
        chunk: int,
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """({"selector_loss_sum": the weighted selector loss}, the walk's hits)."""
        total, hits = selector_loss_sum(
            self.selector, rows, lm_head, labels, row_weights, candidates, candidate_logits,
            rows.shape[0] if self.whole_batch else chunk, self.chunk_fn,
        )  # fmt: skip
        return {"selector_loss_sum": self.weight * total}, hits


def check_selector_weight(drafter: DrafterConfig, scored_slots: int) -> None:
    """Raise ValueError unless the selector loss, weighted by
    drafter.selector_loss_weight, stays finite in float32 over a batch of
    ``scored_slots`` (every slot at a cross-entropy of ln(top_k): a uniform choice among
    the candidates)."""
    largest_float32 = torch.finfo(torch.float32).max
    per_slot = max(1.0, math.log(drafter.selector_top_k))
    largest = largest_float32 / (scored_slots * per_slot)
    if drafter.selector_loss_weight > largest:
        raise ValueError(
            f"drafter.selector_loss_weight = {drafter.selector_loss_weight:g}: the weighted "
            f"selector loss of a batch ({scored_slots} scored slots at a cross-entropy of "
            f"ln(selector_top_k) = {per_slot:.3g} each) must stay below float32's largest "
            f"value {largest_float32:.3g}, so the weight must be at most {largest:.3g}; the "
            "default is 1"
        )
