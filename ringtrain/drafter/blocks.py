"""Anchor sampling and block construction for one packed batch (static shapes, no host syncs).

For every document, up to ceil(num_anchors * doc_len / anchor_ref_len) anchors are drawn
without replacement among the positions p with loss_mask[p] == loss_mask[p + 1] == 1 and
p + 1 inside the document. If the batch's quotas add up to more than the static maximum A,
each document keeps the same share of its draws (the ones drawn first). A block is
`[token at p, MASK x (B - 1)]` at positions p .. p + B - 1 of its document; slot k is scored
against the token AT p + k (not shifted) where k >= 1, p + k is inside the document and
loss_mask[p + k] == 1. Everything is computed on the batch's device from a torch.Generator.
`pack_context` and `blocks_at` are the two halves around the sampling, for callers that
choose the anchors themselves (evaluation anchors every eligible row).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ringtrain.batch import PackedRows
from ringtrain.drafter.config import DrafterConfig
from ringtrain.drafter.masks import TILE


@dataclass(frozen=True)
class BlockBatch:
    """Context and blocks of one batch, padded to the static layout (C rows, A blocks)."""

    ctx_features: torch.Tensor  # [C, K*H], rows >= num_tokens are zero
    ctx_positions: torch.Tensor  # [C] int64, per-document positions
    block_ids: torch.Tensor  # [A * B] int64
    block_positions: torch.Tensor  # [A * B] int64
    labels: torch.Tensor  # [A, B] int64, the token at anchor + k (0 where unscored)
    scored: torch.Tensor  # [A, B] bool
    valid: torch.Tensor  # [A] bool, False for padding blocks
    anchor: torch.Tensor  # [A] int64, packed row of the anchor (0 for padding)
    ctx_lo: torch.Tensor  # [A] int64, first visible context row (document start)
    ctx_hi: torch.Tensor  # [A] int64, end of the visible context (the anchor itself)


def layout_sizes(cfg: DrafterConfig, max_tokens: int) -> tuple[int, int]:
    """Static (context rows C, anchors A) for a batch capacity of max_tokens tokens.

    C is max_tokens rounded up to the attention tile; A is cfg.max_anchors (or the anchor
    rate times max_tokens) rounded up so that A * block_size is a whole number of tiles.
    """
    ctx_capacity = -(-max_tokens // TILE) * TILE
    anchors = cfg.max_anchors or math.ceil(cfg.num_anchors * max_tokens / cfg.anchor_ref_len)
    step = TILE // math.gcd(TILE, cfg.block_size)
    max_anchors = -(-anchors // step) * step
    if max_anchors > ctx_capacity:
        raise ValueError(
            f"[drafter] max_anchors={max_anchors} exceeds the context capacity {ctx_capacity}; "
            "lower num_anchors / max_anchors"
        )
    return ctx_capacity, max_anchors


def _padded(values: torch.Tensor, num_tokens: int, rows: int, dtype: torch.dtype) -> torch.Tensor:
    out = torch.zeros(rows, dtype=dtype, device=values.device)
    out[:num_tokens] = values[:num_tokens]
    return out


@dataclass(frozen=True)
class PackedContext:
    """One batch padded to the static context layout, with every row's document bounds."""

    ctx_features: torch.Tensor  # [C, K*H], rows >= num_tokens are zero
    ids: torch.Tensor  # [C] int64
    positions: torch.Tensor  # [C] int64, per-document positions
    supervised: torch.Tensor  # [C + 1] bool, loss_mask != 0 (False past num_tokens)
    starts: torch.Tensor  # [D + 1] int64, document starts (entry D: the padding "document")
    ends: torch.Tensor  # [D + 1] int64, document ends
    doc: torch.Tensor  # [C] int64, document of each row (D for padding rows)
    eligible: torch.Tensor  # [C] bool, loss_mask[p] == loss_mask[p + 1] == 1, p + 1 in the doc


def pack_context(batch: PackedRows, ctx_capacity: int) -> PackedContext:
    """Pad one packed batch to ctx_capacity rows and find its anchor-eligible rows."""
    hidden, input_ids, loss_mask = batch.hidden, batch.input_ids, batch.loss_mask
    position_ids, cu_seqlens = batch.position_ids, batch.cu_seqlens
    num_tokens, num_docs = batch.num_tokens, batch.num_docs
    if num_tokens > ctx_capacity or num_tokens > hidden.shape[0]:
        raise ValueError(
            f"batch has {num_tokens} tokens but the context capacity is {ctx_capacity} and "
            f"hidden has {hidden.shape[0]} rows; raise max_tokens to the slot capacity"
        )
    if num_docs < 1 or cu_seqlens.shape[0] < num_docs + 1:
        raise ValueError(
            f"num_docs={num_docs} needs {num_docs + 1} cu_seqlens entries, "
            f"got {cu_seqlens.shape[0]}"
        )
    device = hidden.device
    rows = ctx_capacity
    ids = _padded(input_ids.to(device), num_tokens, rows, torch.int64)
    positions = _padded(position_ids.to(device), num_tokens, rows, torch.int64)
    supervised = _padded(loss_mask.to(device) != 0, num_tokens, rows + 1, torch.bool)
    ctx_features = hidden.new_zeros(rows, hidden.shape[1])
    ctx_features[:num_tokens] = hidden[:num_tokens]

    bounds = cu_seqlens[: num_docs + 1].to(device, torch.int64)
    zero = bounds.new_zeros(1)
    starts = torch.cat((bounds[:-1], zero))  # index num_docs: the padding "document"
    ends = torch.cat((bounds[1:], zero))
    ends_marks = torch.zeros(rows + 1, dtype=torch.int64, device=device)
    ends_marks.index_add_(0, bounds[1:].clamp(max=rows), torch.ones_like(bounds[1:]))
    doc = ends_marks.cumsum(0)[:rows]  # document of each row; num_docs for padding rows
    row = torch.arange(rows, device=device)
    eligible = supervised[:rows] & supervised[1:] & (row + 1 < ends[doc])
    return PackedContext(ctx_features, ids, positions, supervised, starts, ends, doc, eligible)


def _sample_anchors(
    packed: PackedContext, generator: torch.Generator, cfg: DrafterConfig, max_anchors: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(anchor rows [A] sorted, padding rows 0; valid [A]) drawn as the module docstring says."""
    doc, eligible = packed.doc, packed.eligible
    rows, device = doc.shape[0], doc.device
    num_docs = packed.starts.shape[0] - 1
    row = torch.arange(rows, device=device)
    lengths = packed.ends - packed.starts
    quota = (cfg.num_anchors * lengths + cfg.anchor_ref_len - 1) // cfg.anchor_ref_len
    noise = torch.rand(rows, generator=generator, device=generator.device, dtype=torch.float64)
    key = torch.where(eligible, doc.double() + noise.to(device), torch.inf)
    order = torch.argsort(key)  # eligible rows grouped by document, shuffled within it
    sorted_doc = doc[order]
    per_doc = torch.zeros(num_docs + 1, dtype=torch.int64, device=device)
    per_doc.index_add_(0, doc, eligible.long())
    rank = row - (per_doc.cumsum(0) - per_doc)[sorted_doc]
    doc_quota = quota[sorted_doc]
    chosen = eligible[order] & (rank < doc_quota)
    share = torch.where(chosen, (rank + 0.5) / doc_quota.clamp(min=1), torch.inf)
    share_kept, picked = torch.topk(share, max_anchors, largest=False)
    anchor = torch.where(share_kept.isfinite(), order[picked], rows).sort().values
    valid = anchor < rows
    return torch.where(valid, anchor, 0), valid


def blocks_at(
    packed: PackedContext,
    anchor: torch.Tensor,
    valid: torch.Tensor,
    block_size: int,
    mask_token_id: int,
) -> BlockBatch:
    """The blocks anchored at packed rows anchor [A] (entries with valid False are padding)."""
    rows, device = packed.ids.shape[0], anchor.device
    anchor_doc = packed.doc[anchor]
    slot = torch.arange(block_size, device=device)
    label_rows = anchor[:, None] + slot
    inside = label_rows < packed.ends[anchor_doc][:, None]
    label_rows = label_rows.clamp(max=rows - 1)
    block_ids = torch.full(
        (anchor.shape[0], block_size), mask_token_id, dtype=torch.int64, device=device
    )
    block_ids[:, 0] = torch.where(valid, packed.ids[anchor], mask_token_id)
    return BlockBatch(
        ctx_features=packed.ctx_features,
        ctx_positions=packed.positions,
        block_ids=block_ids.view(-1),
        block_positions=(packed.positions[anchor][:, None] + slot).view(-1),
        labels=torch.where(inside, packed.ids[label_rows], 0),
        scored=valid[:, None] & inside & packed.supervised[label_rows] & (slot >= 1),
        valid=valid,
        anchor=anchor,
        ctx_lo=torch.where(valid, packed.starts[anchor_doc], 0),
        ctx_hi=anchor,
    )


def build_blocks(
    batch: PackedRows,
    generator: torch.Generator,
    cfg: DrafterConfig,
    mask_token_id: int,
    ctx_capacity: int,
    max_anchors: int,
) -> BlockBatch:
    """Sample anchors and lay out the blocks of one packed batch (see the module docstring)."""
    packed = pack_context(batch, ctx_capacity)
    anchor, valid = _sample_anchors(packed, generator, cfg, max_anchors)
    return blocks_at(packed, anchor, valid, cfg.block_size, mask_token_id)
