"""The DFlash2 drafter: DFlash plus an in-block dynamic convolution and a top-k path selector.

Two modules are added to the DFlash drafter (drafter/model.py), with the parameter names
the serving engines load for ``DFlash2DraftModel`` (docs/dflash2.md):

- ``layers.N.attention_conv`` / ``layers.N.mlp_conv``: a grouped dynamic depthwise
  convolution over block positions, wrapped around each attention and each MLP.
  ``out[t, c] = sum_j (base[j, c] + delta[t, j, c // group]) * x[t - j, c]``, taps never
  reach across a block boundary (block position t < j reads zero). One projection of the
  sublayer's (normed) input gives the corrections ``delta`` of both convolutions: the one
  before the sublayer (side 0 of ``base_kernel``) and the one after it (side 1). The
  target context is not convolved.
- ``candidate_selector``: instead of each slot's argmax, the drafter keeps each slot's
  top-k tokens and walks greedily from the last accepted token, scoring candidate ``b``
  after predecessor ``a`` as ``logit(b) + <A[a] * P(h), B[b]>`` (``A``, ``B``: token
  codebooks ``[V, rank]``; ``P``: a projection of the slot's final hidden state).

Both start as the identity (unit self tap, no correction; zero successor codebook), so a
fresh DFlash2 drafter computes exactly what DFlash computes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ringtrain.drafter.head import FrozenHead
from ringtrain.drafter.model import INIT_STD, Attend, DecoderLayer, DFlashDrafter
from ringtrain.drafter.spec import DrafterSpec


class BlockConv(nn.Module):
    """The two dynamic convolutions (before and after) around one sublayer."""

    def __init__(self, spec: DrafterSpec) -> None:
        super().__init__()
        self.taps = spec.conv_kernel_size
        self.group_size = spec.conv_group_size
        self.groups = spec.hidden_size // spec.conv_group_size
        self.block_size = spec.block_size
        self.base_kernel = nn.Parameter(torch.zeros(2, self.taps, spec.hidden_size))
        self.kernel_projection = nn.Linear(
            spec.hidden_size, 2 * self.taps * self.groups, bias=False
        )

    def reset_parameters(self) -> None:
        """The identity: unit self tap on both sides, every correction zero."""
        with torch.no_grad():
            self.base_kernel.zero_()
            self.base_kernel[:, 0] = 1.0
            self.kernel_projection.weight.zero_()

    def _convolve(self, x: torch.Tensor, delta: torch.Tensor, side: int) -> torch.Tensor:
        """x [L, H] (whole blocks), delta [L, taps, groups] -> [L, H]."""
        blocks = x.view(-1, self.block_size, self.groups, self.group_size)
        delta = delta.reshape(-1, self.block_size, self.taps, self.groups, 1)
        base = self.base_kernel[side].to(x.dtype).view(self.taps, self.groups, self.group_size)
        out = (base[0] + delta[:, :, 0]) * blocks
        for tap in range(1, self.taps):
            earlier = F.pad(blocks[:, : self.block_size - tap], (0, 0, 0, 0, tap, 0))
            out = out + (base[tap] + delta[:, :, tap]) * earlier
        return out.reshape(x.shape)

    def before(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Convolve the sublayer input; also return the corrections of the after-side."""
        delta = self.kernel_projection(x).view(x.shape[0], 2, self.taps, self.groups)
        return self._convolve(x, delta[:, 0], 0), delta[:, 1]

    def after(self, y: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        """Convolve the sublayer output with the corrections `before` returned."""
        return self._convolve(y, delta, 1)


class DFlash2DecoderLayer(DecoderLayer):
    """The DFlash decoder layer with a BlockConv around its attention and its MLP."""

    def __init__(self, spec: DrafterSpec) -> None:
        super().__init__(spec)
        self.attention_conv = BlockConv(spec)
        self.mlp_conv = BlockConv(spec)

    def forward(
        self,
        x: torch.Tensor,
        ctx: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        attend: Attend,
    ) -> torch.Tensor:
        """x [L, H]: whole blocks laid out one after another."""
        h, delta = self.attention_conv.before(self.input_layernorm(x))
        x = x + self.attention_conv.after(self.self_attn(h, ctx, cos, sin, attend), delta)
        h, delta = self.mlp_conv.before(self.post_attention_layernorm(x))
        return x + self.mlp_conv.after(self.mlp(h), delta)


class CandidateSelector(nn.Module):
    """Scores a slot's top-k candidates after a predecessor token (low-rank bilinear)."""

    def __init__(self, spec: DrafterSpec) -> None:
        super().__init__()
        self.top_k = spec.selector_top_k
        self.predecessor_codebook = nn.Parameter(torch.empty(spec.vocab_size, spec.selector_rank))
        self.successor_codebook = nn.Parameter(torch.empty(spec.vocab_size, spec.selector_rank))
        self.hidden_projection = nn.Linear(spec.hidden_size, spec.selector_rank, bias=False)

    def reset_parameters(self) -> None:
        """No-op start: the successor codebook zero (every score is the slot's logit)."""
        with torch.no_grad():
            self.predecessor_codebook.normal_(std=INIT_STD)
            self.successor_codebook.zero_()
            self.hidden_projection.weight.normal_(std=INIT_STD)

    def scores(
        self,
        hidden: torch.Tensor,
        unary: torch.Tensor,
        candidates: torch.Tensor,
        predecessors: torch.Tensor,
    ) -> torch.Tensor:
        """hidden [..., H], unary and candidates [..., k], predecessors [...] -> [..., k]."""
        projected = self.hidden_projection(hidden.to(self.hidden_projection.weight.dtype))
        # Codebook rows by F.embedding, whose backward is made for many repeats of a few
        # rows (common tokens fill most candidate lists); an index's backward is a sort and
        # an accumulating index_put (15.5 ms a step on the Qwen3-8B drafter shape).
        gate = F.embedding(predecessors, self.predecessor_codebook) * projected
        successors = F.embedding(candidates, self.successor_codebook)
        pair = torch.einsum("...r,...kr->...k", gate, successors)
        return unary + pair.to(unary.dtype)

    def walk(
        self, hidden: torch.Tensor, logits: torch.Tensor, anchor: torch.Tensor
    ) -> torch.Tensor:
        """Greedy path [S] through slots hidden [S, H] / logits [S, V] after token `anchor`.

        Every index stays a one-element device tensor (a 0-d tensor index is read on the
        host), so the walk runs without a host sync and a CUDA graph can hold it."""
        unary, candidates = logits.topk(self.top_k, dim=-1)
        path = []
        predecessor = anchor.reshape(1)
        for slot in range(hidden.shape[0]):
            row = slice(slot, slot + 1)
            slot_scores = self.scores(hidden[row], unary[row], candidates[row], predecessor)
            predecessor = candidates[row].gather(-1, slot_scores.argmax(-1, keepdim=True))[:, 0]
            path.append(predecessor)
        return torch.cat(path)


class DFlash2Drafter(DFlashDrafter):
    """DFlash with BlockConv-wrapped layers and a candidate selector for its proposals."""

    layer_class = DFlash2DecoderLayer

    def __init__(self, spec: DrafterSpec) -> None:
        if spec.architecture != "dflash2":
            raise ValueError(
                f"DFlash2Drafter built from a spec of architecture {spec.architecture!r}"
            )
        super().__init__(spec)
        self.candidate_selector = CandidateSelector(spec)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """DFlash's initialisation, then the added modules at their identity start."""
        super().reset_parameters()
        for module in self.modules():
            if isinstance(module, (BlockConv, CandidateSelector)):
                module.reset_parameters()

    @torch.no_grad()
    def propose(
        self,
        head: FrozenHead,
        ctx_features: torch.Tensor,
        ctx_positions: torch.Tensor,
        block_ids: torch.Tensor,
        block_positions: torch.Tensor,
        ctx_valid: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The selector's greedy path through slots 1..B-1, starting after block_ids[0]
        (arguments as draft_hidden)."""
        hidden = self.draft_hidden(
            head, ctx_features, ctx_positions, block_ids, block_positions, ctx_valid
        )
        logits = self.head_logits(head, hidden[1:])
        return self.candidate_selector.walk(hidden[1:], logits, block_ids[0])


def selector_loss_sum(
    selector: CandidateSelector,
    rows: torch.Tensor,
    lm_head: torch.Tensor,
    labels: torch.Tensor,
    row_weights: torch.Tensor,
    candidates: torch.Tensor,
    chunk: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of row_weights * CE of the selector over each scored slot's top-k candidates,
    whether the walk picks each slot's true token).

    rows [A * (B-1), H] are the final hidden states of slots 1..B-1, labels [A, B] the true
    tokens of slots 0..B-1 (slot 0: the anchor), row_weights [A, B-1] and candidates
    [A * (B-1), top_k] each row's top-k tokens by logit (chunked_head_loss hands them over
    from the logits it forms for the cross-entropy). Slot k is scored
    after its true predecessor (the label of slot k - 1, as the walk would have it had
    every earlier slot been right) and labelled with its true token's index among the
    candidates; a slot whose true token misses the top-k adds nothing. The second result
    [A * (B-1)] is the walk's proposal rule under the same teacher forcing: slot k's best
    scored candidate is its true token. A block's leading run of those is exactly the
    prefix `walk` gets accepted. `chunk` rows are scored at a time; the unary scores (the
    candidates' logits) are formed again, with gradient, from the candidates' LM-head rows
    alone, so the backward pass never sees a vocabulary-wide logit matrix.
    """
    predecessors = labels[:, :-1].reshape(-1)
    targets = labels[:, 1:].reshape(-1)
    weights = row_weights.reshape(-1)
    total = rows.new_zeros((), dtype=torch.promote_types(lm_head.dtype, torch.float32))
    picked = []
    for start in range(0, rows.shape[0], chunk):
        part = slice(start, start + chunk)
        top = candidates[part]
        # A product and a sum (not a matmul, which autocast would run in bf16): float32.
        unary = (rows[part, None].to(total.dtype) * lm_head[top].to(total.dtype)).sum(-1)
        scores = selector.scores(rows[part], unary, top, predecessors[part])
        hits = top == targets[part, None]
        loss = F.cross_entropy(scores, hits.long().argmax(-1), reduction="none")
        total = total + (loss * weights[part] * hits.any(-1)).sum()
        picked.append(top.gather(-1, scores.detach().argmax(-1, keepdim=True)))
    return total, torch.cat(picked).squeeze(-1) == targets
