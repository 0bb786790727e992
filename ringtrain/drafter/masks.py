"""flex_attention BlockMasks for DFlash training blocks over a packed context.

Keys/values are laid out as `[ctx (C rows) ; block 0 ; block 1 ; ...]` and queries as
`[block 0 ; block 1 ; ...]`, each block B rows. Block a, anchored at packed row p of a
document starting at packed row s, sees the context rows s <= kv < p (strictly before its
anchor: at inference the anchor's own hidden state does not exist yet), all B rows of
itself, and nothing else. A sliding-window layer (window w) further limits a query at
position p + k to keys with (p + k) - kv < w; with ``causal`` its block slot k sees only
slots 0..k of its block (the window never cuts into a block: w >= B). Padding blocks
see only themselves.

Every row of a block sees one interval of the context and one of the block region, so
the tile-level structure (which 128 x 128 tiles are empty, partial or full) is computed
exactly from interval overlaps on the device, with static shapes; no dense mask is ever
built. The mask_mod reads per-block bounds from buffers that are refilled in place for
every batch, so the function object and its tensors never change and a compiled graph
never recompiles because of them. Consequence: run backward before building the masks of
the next batch with the same builder.

An eager drafter (any CPU, where flex_attention has no backward; a GPU with
drafter.compile false, where uncompiled flex_attention scores the whole matrix) gathers
each block's candidate keys instead (`GatheredMask`): the W context rows from its first
visible row (in a sliding layer, the first its window reaches), W the longest visible
context of the batch, then its own B rows, with the same mask_mod saying which of them
each query row sees. Attention then scores B x (W + B) pairs per block rather than
every query against all C + A * B keys: about an eighth of the dense work on the embedded
default's batches.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn.attention.flex_attention import BlockMask

TILE = 128


@dataclass(frozen=True)
class GatheredMask:
    """Each block's candidate keys and which of them its query rows see.

    ``keys`` [A, W + B]: rows of [ctx ; blocks] (the W context rows from the block's first
    visible row, then its own B rows; context rows past its visible end point at row 0);
    ``visible`` [A, B, W + B]: whether query row k of block a sees key j."""

    keys: torch.Tensor
    visible: torch.Tensor


class BlockMaskBuilder:
    """Builds the BlockMask of every distinct window for one static (C, A, B) layout."""

    def __init__(
        self,
        ctx_capacity: int,
        max_anchors: int,
        block_size: int,
        windows: tuple[int, ...],
        device: torch.device,
        causal: bool = False,
        compile_backend: str | None = None,
    ) -> None:
        if ctx_capacity % TILE or (max_anchors * block_size) % TILE:
            raise ValueError(
                f"mask layout C={ctx_capacity}, A*B={max_anchors * block_size} must be "
                f"multiples of {TILE}"
            )
        self.ctx_capacity = ctx_capacity
        self.max_anchors = max_anchors
        self.block_size = block_size
        self.q_len = max_anchors * block_size
        self.kv_len = ctx_capacity + self.q_len
        self.device = device
        self.causal = causal
        self.ctx_lo = torch.zeros(max_anchors, dtype=torch.int32, device=device)
        self.ctx_hi = torch.zeros(max_anchors, dtype=torch.int32, device=device)
        self.anchor = torch.zeros(max_anchors, dtype=torch.int32, device=device)
        self.mask_mods = {w: self._make_mask_mod(w) for w in sorted(set(windows))}
        rows = torch.arange(self.q_len, device=device)
        self._row_block = rows // block_size
        self._row_slot = rows % block_size
        tiles = torch.arange(self.kv_len // TILE, device=device)
        self._tile_lo = tiles * TILE
        self._tile_hi = self._tile_lo + TILE
        block_lo = ctx_capacity + self._row_block * block_size
        self._block_counts = self._tile_counts(block_lo, block_lo + block_size)
        self._causal_block_counts = self._tile_counts(block_lo, block_lo + self._row_slot + 1)
        # Compiled (a compiled drafter's masks, backend "inductor"): the tiles are
        # classified, for the forward and the backward, by a few fused kernels instead of
        # about a hundred small ones, which the GPU otherwise waits for while they are
        # launched one by one at every step's start.
        self._tiles = (
            torch.compile(self._classified_tiles, backend=compile_backend, dynamic=False)
            if compile_backend is not None
            else self._classified_tiles
        )

    def _causal(self, window: int) -> bool:
        """Whether blocks are causal in layers of this window (sliding layers only)."""
        return self.causal and window > 0

    def _make_mask_mod(self, window: int):
        ctx_lo, ctx_hi, anchor = self.ctx_lo, self.ctx_hi, self.anchor
        ctx_capacity, block_size = self.ctx_capacity, self.block_size
        causal = self._causal(window)

        def mask_mod(b, h, q_idx, kv_idx):
            block = q_idx // block_size
            lo = ctx_lo[block]
            if window:
                lo = torch.maximum(lo, anchor[block] + q_idx % block_size - (window - 1))
            own = ctx_capacity + block * block_size
            in_ctx = (kv_idx >= lo) & (kv_idx < ctx_hi[block])
            own_end = own + q_idx % block_size + 1 if causal else own + block_size
            return in_ctx | ((kv_idx >= own) & (kv_idx < own_end))

        return mask_mod

    def _tile_counts(self, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
        """Visible (query, key) pairs per (q tile, kv tile) for per-row key intervals [lo, hi)."""
        overlap = torch.minimum(hi[:, None], self._tile_hi[None, :]) - torch.maximum(
            lo[:, None], self._tile_lo[None, :]
        )
        overlap = overlap.clamp_(min=0).to(torch.int32)
        return overlap.view(self.q_len // TILE, TILE, -1).sum(1, dtype=torch.int32)

    def _classified_tiles(self, window: int) -> tuple[torch.Tensor, ...]:
        """The partial and the full tiles as a BlockMask holds them: the kv tiles of every
        q tile (partial count, partial indices, full count, full indices; the forward's),
        then the q tiles of every kv tile, the same four (the backward's). BlockMask's
        own from_kv_blocks would derive the second four from the first, eagerly."""
        lo = self.ctx_lo[self._row_block].long()
        hi = self.ctx_hi[self._row_block].long()
        if window:
            rows_anchor = self.anchor[self._row_block].long()
            lo = torch.maximum(lo, rows_anchor + self._row_slot - (window - 1))
        own = self._causal_block_counts if self._causal(window) else self._block_counts
        counts = self._tile_counts(lo, hi) + own
        full = counts == TILE * TILE
        partial = (counts > 0) & ~full
        by_q_tile = (*_ordered_tiles(partial), *_ordered_tiles(full))
        by_kv_tile = (*_ordered_tiles(partial.T), *_ordered_tiles(full.T))
        return by_q_tile + by_kv_tile

    def _block_mask(self, window: int) -> BlockMask:
        (
            kv_num, kv_indices, full_kv_num, full_kv_indices,
            q_num, q_indices, full_q_num, full_q_indices,
        ) = self._tiles(window)  # fmt: skip
        return BlockMask(
            seq_lengths=(self.q_len, self.kv_len),
            kv_num_blocks=kv_num,
            kv_indices=kv_indices,
            full_kv_num_blocks=full_kv_num,
            full_kv_indices=full_kv_indices,
            q_num_blocks=q_num,
            q_indices=q_indices,
            full_q_num_blocks=full_q_num,
            full_q_indices=full_q_indices,
            BLOCK_SIZE=(TILE, TILE),
            mask_mod=self.mask_mods[window],
        )

    def _gathered_mask(self, window: int) -> GatheredMask:
        lo, hi = self.ctx_lo.long(), self.ctx_hi.long()
        if window:  # no row of the block sees a key before its first row's window
            lo = torch.maximum(lo, self.anchor.long() - (window - 1))
        span = int((hi - lo).max())  # a host sync: this path is the eager drafter's
        ctx_rows = lo[:, None] + torch.arange(span, device=self.device)
        in_span = ctx_rows < hi[:, None]
        own_rows = self.ctx_capacity + torch.arange(self.q_len, device=self.device)
        keys = torch.cat(
            (torch.where(in_span, ctx_rows, 0), own_rows.view(self.max_anchors, -1)), dim=1
        )
        q_idx = torch.arange(self.q_len, device=self.device).view(self.max_anchors, -1, 1)
        visible = self.mask_mods[window](0, 0, q_idx, keys[:, None, :])
        visible[:, :, :span] &= in_span[:, None, :]
        return GatheredMask(keys, visible)

    def build(
        self,
        ctx_lo: torch.Tensor,
        ctx_hi: torch.Tensor,
        anchor: torch.Tensor,
        gathered: bool = False,
    ) -> dict[int, BlockMask | GatheredMask]:
        """Mask per window for per-block context bounds [ctx_lo, ctx_hi) and anchors [A].

        A BlockMask for flex_attention, or with gathered=True each block's keys gathered
        with what its rows see (`GatheredMask`; CPU training: flex_attention has no CPU
        backward).
        """
        self.ctx_lo.copy_(ctx_lo)
        self.ctx_hi.copy_(ctx_hi)
        self.anchor.copy_(anchor)
        make = self._gathered_mask if gathered else self._block_mask
        return {window: make(window) for window in self.mask_mods}


def _ordered_tiles(tiles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of `tiles` [rows, columns]: how many columns are set, and their indices
    first (ascending), with the leading batch and head dimensions BlockMask takes."""
    num = tiles.sum(-1, dtype=torch.int32)
    order = torch.argsort(tiles.to(torch.int32), dim=-1, descending=True, stable=True)
    return num[None, None], order.to(torch.int32)[None, None]
