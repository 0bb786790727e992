"""Anchor sampling, block labels and BlockMasks against independent references (CPU)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask

from ringtrain.drafter.arch.dflash.model import _gathered_attend
from ringtrain.drafter.blocks import build_blocks, layout_sizes
from ringtrain.drafter.config import DrafterConfig
from ringtrain.drafter.masks import TILE, BlockMaskBuilder, GatheredMask
from ringtrain.packed_batch import random_packed_batch

MASK_ID = 99
VOCAB = 100
# A BlockMask's tile tensors, what the builder computes: the forward's (kv tiles of each
# q tile), then the backward's (q tiles of each kv tile).
KV_BLOCK_FIELDS = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices")
Q_BLOCK_FIELDS = ("q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices")


def assert_backward_tiles_as_torch_derives_them(block_mask: BlockMask) -> None:
    """The builder's q-side tiles (flex_attention's backward reads them) equal those
    BlockMask.from_kv_blocks derives from its kv-side tiles."""
    derived = BlockMask.from_kv_blocks(
        *(getattr(block_mask, name) for name in KV_BLOCK_FIELDS), BLOCK_SIZE=TILE
    )
    for name in Q_BLOCK_FIELDS:
        torch.testing.assert_close(getattr(block_mask, name), getattr(derived, name), msg=name)


def random_case(seed: int, block_size: int = 8, num_anchors: int = 6):
    """A random packed batch (random document lengths and holes) and its blocks."""
    rng = np.random.default_rng(seed)
    cfg = DrafterConfig(block_size=block_size, num_anchors=num_anchors, anchor_ref_len=40)
    max_tokens = 250
    lens: list[int] = []
    while sum(lens) < 150:
        lens.append(int(rng.integers(1, 90)))
    lens = lens[:-1] if sum(lens) > max_tokens else lens
    batch = random_packed_batch(lens, 4, VOCAB, "cpu", torch.float32, seed, mask_holes=10)
    ctx_capacity, max_anchors = layout_sizes(cfg, max_tokens)
    gen = torch.Generator().manual_seed(seed)
    blocks = build_blocks(
        batch, gen, cfg, MASK_ID, ctx_capacity, max_anchors,
    )  # fmt: skip
    return cfg, batch, blocks, ctx_capacity, max_anchors


def reference_mask(blocks, batch, ctx_capacity, max_anchors, block_size, window, causal=False):
    """Dense [A*B, C + A*B] mask written from the rules, one row at a time."""
    mask = np.zeros((max_anchors * block_size, ctx_capacity + max_anchors * block_size), bool)
    for a, (p, valid) in enumerate(zip(blocks.anchor.tolist(), blocks.valid.tolist(), strict=True)):
        own = ctx_capacity + a * block_size
        for k in range(block_size):
            row = a * block_size + k
            mask[row, own : own + (k + 1 if causal and window else block_size)] = True
            if valid:
                start, _ = batch.doc_bounds(p)
                lo = max(start, p + k - window + 1) if window else start
                mask[row, lo:p] = True
    return mask


def expand_block_mask(block_mask, mask_mod, q_len, kv_len):
    """Dense mask a flex kernel computes: full tiles all True, partial tiles via mask_mod."""
    dense_mod = mask_mod(0, 0, torch.arange(q_len)[:, None], torch.arange(kv_len)[None, :])
    out = torch.zeros(q_len, kv_len, dtype=torch.bool)
    tiles = [
        (block_mask.kv_num_blocks, block_mask.kv_indices, False),
        (block_mask.full_kv_num_blocks, block_mask.full_kv_indices, True),
    ]
    for num, indices, full in tiles:
        for qt in range(q_len // TILE):
            for kt in indices[0, 0, qt, : num[0, 0, qt]].tolist():
                rows, cols = slice(qt * TILE, (qt + 1) * TILE), slice(kt * TILE, (kt + 1) * TILE)
                out[rows, cols] = True if full else dense_mod[rows, cols]
    return out.numpy()


def expand_gathered_mask(mask: GatheredMask, kv_len: int) -> np.ndarray:
    """How often each query row sees each key among its gathered ones, [A*B, kv_len]
    (a key seen twice would count twice in its softmax)."""
    blocks, block, _ = mask.visible.shape
    rows = np.arange(blocks * block).reshape(blocks, block, 1)
    columns = mask.keys.numpy()[:, None, :]
    out = np.zeros((blocks * block, kv_len), int)
    np.add.at(out, tuple(np.broadcast_arrays(rows, columns)), mask.visible.numpy().astype(int))
    return out


@pytest.mark.parametrize(("window", "causal"), [(0, False), (24, False), (24, True), (0, True)])
def test_block_mask_equals_dense_reference(window: int, causal: bool) -> None:
    for seed in range(25):
        cfg, batch, blocks, ctx_capacity, max_anchors = random_case(seed)
        builder = BlockMaskBuilder(
            ctx_capacity, max_anchors, cfg.block_size, (window,), torch.device("cpu"), causal
        )
        expected = reference_mask(
            blocks, batch, ctx_capacity, max_anchors, cfg.block_size, window, causal
        )
        block_mask = builder.build(blocks.ctx_lo, blocks.ctx_hi, blocks.anchor)[window]
        q_len, kv_len = expected.shape
        got = expand_block_mask(block_mask, builder.mask_mods[window], q_len, kv_len)
        np.testing.assert_array_equal(got, expected, err_msg=f"seed {seed}")
        # Tight tiles: no listed partial tile is empty, no full tile is left partial.
        tiles = expected.reshape(q_len // TILE, TILE, kv_len // TILE, TILE).sum((1, 3))
        partial = block_mask.kv_num_blocks[0, 0].sum().item()
        full = block_mask.full_kv_num_blocks[0, 0].sum().item()
        assert partial == int(((tiles > 0) & (tiles < TILE * TILE)).sum()), f"seed {seed}"
        assert full == int((tiles == TILE * TILE).sum()), f"seed {seed}"
        assert_backward_tiles_as_torch_derives_them(block_mask)
        gathered = builder.build(blocks.ctx_lo, blocks.ctx_hi, blocks.anchor, gathered=True)
        seen = expand_gathered_mask(gathered[window], kv_len)
        np.testing.assert_array_equal(seen, expected.astype(int), err_msg=f"seed {seed}")


def test_block_mask_has_full_tiles_for_long_documents() -> None:
    cfg = DrafterConfig(block_size=16, num_anchors=64, anchor_ref_len=1024)
    batch = random_packed_batch([1024], 4, VOCAB, "cpu", torch.float32, 0, prompt_fraction=0.0)
    ctx_capacity, max_anchors = layout_sizes(cfg, 1024)
    blocks = build_blocks(
        batch, torch.Generator().manual_seed(0), cfg, MASK_ID,
        ctx_capacity, max_anchors,
    )  # fmt: skip
    builder = BlockMaskBuilder(ctx_capacity, max_anchors, 16, (0,), torch.device("cpu"))
    block_mask = builder.build(blocks.ctx_lo, blocks.ctx_hi, blocks.anchor)[0]
    assert block_mask.full_kv_num_blocks.sum() > 0
    assert_backward_tiles_as_torch_derives_them(block_mask)
    expected = reference_mask(blocks, batch, ctx_capacity, max_anchors, 16, 0)
    got = expand_block_mask(block_mask, builder.mask_mods[0], *expected.shape)
    np.testing.assert_array_equal(got, expected)


def test_a_tile_holding_one_visible_pair_is_visited() -> None:
    """A block whose first row's window reaches one row into a context tile: that tile holds
    a single visible (query, key) pair, and it is still listed for flex_attention."""
    block_size, window, anchors = 16, 24, 8
    builder = BlockMaskBuilder(2 * TILE, anchors, block_size, (window,), torch.device("cpu"))
    anchor = torch.zeros(anchors, dtype=torch.int64)
    anchor[0] = TILE + window - 2  # slot 0 sees rows TILE - 1 .. anchor - 1, slot 1 from TILE
    block_mask = builder.build(torch.zeros_like(anchor), anchor, anchor)[window]
    q_len, kv_len = anchors * block_size, 2 * TILE + anchors * block_size
    mask_mod = builder.mask_mods[window]
    dense = mask_mod(0, 0, torch.arange(q_len)[:, None], torch.arange(kv_len)[None, :])
    assert int(dense[:, :TILE].sum()) == 1
    got = expand_block_mask(block_mask, mask_mod, q_len, kv_len)
    np.testing.assert_array_equal(got, dense.numpy())


def test_anchors_are_eligible_unique_and_follow_the_quota() -> None:
    for seed in range(25):
        cfg, batch, blocks, _, max_anchors = random_case(seed)
        mask = batch.loss_mask.tolist()
        anchors = blocks.anchor[blocks.valid].tolist()
        assert anchors == sorted(set(anchors)), "anchors are unique and sorted"
        per_doc: dict[int, int] = {}
        for p in anchors:
            start, end = batch.doc_bounds(p)
            assert p + 1 < end and mask[p] == 1 and mask[p + 1] == 1, f"seed {seed} anchor {p}"
            per_doc[start] = per_doc.get(start, 0) + 1
        bounds = batch.cu_seqlens.tolist()
        total_quota = 0
        for start, end in itertools.pairwise(bounds):
            eligible = sum(mask[p] and mask[p + 1] for p in range(start, end - 1))
            quota = min(eligible, math.ceil(cfg.num_anchors * (end - start) / cfg.anchor_ref_len))
            total_quota += quota
            assert per_doc.get(start, 0) <= quota
        assert len(anchors) == min(total_quota, max_anchors), f"seed {seed}"


def test_anchor_cap_keeps_a_share_of_every_document() -> None:
    cfg = DrafterConfig(block_size=8, num_anchors=40, anchor_ref_len=40, max_anchors=32)
    batch = random_packed_batch([100, 100], 4, VOCAB, "cpu", torch.float32, 1, prompt_fraction=0)
    ctx_capacity, max_anchors = layout_sizes(cfg, 256)
    blocks = build_blocks(
        batch, torch.Generator().manual_seed(0), cfg, MASK_ID,
        ctx_capacity, max_anchors,
    )  # fmt: skip
    anchors = blocks.anchor[blocks.valid]
    assert len(anchors) == max_anchors == 32
    assert 12 <= int((anchors < 100).sum()) <= 20


def test_anchor_sampling_is_reproducible_from_the_generator() -> None:
    def anchors(seed: int) -> list[int]:
        cfg = DrafterConfig(block_size=8, num_anchors=6, anchor_ref_len=40)
        batch = random_packed_batch([120, 80], 4, VOCAB, "cpu", torch.float32, 3)
        blocks = build_blocks(
            batch,
            torch.Generator().manual_seed(seed), cfg, MASK_ID, *layout_sizes(cfg, 256),
        )  # fmt: skip
        return blocks.anchor[blocks.valid].tolist()

    assert anchors(5) == anchors(5)
    assert anchors(5) != anchors(6)


def test_block_tokens_positions_and_labels() -> None:
    """Slot k is labelled with the token AT anchor + k; slot 0, prompt and foreign rows never."""
    for seed in range(10):
        cfg, batch, blocks, _, _ = random_case(seed)
        ids, mask, pos = batch.input_ids.tolist(), batch.loss_mask.tolist(), batch.position_ids
        block = cfg.block_size
        for a, p in enumerate(blocks.anchor.tolist()):
            row_ids = blocks.block_ids[a * block : (a + 1) * block].tolist()
            if not blocks.valid[a]:
                assert not blocks.scored[a].any()
                continue
            _, end = batch.doc_bounds(p)
            assert row_ids == [ids[p]] + [MASK_ID] * (block - 1)
            expected_pos = [int(pos[p]) + k for k in range(block)]
            assert blocks.block_positions[a * block : (a + 1) * block].tolist() == expected_pos
            for k in range(block):
                scored = k >= 1 and p + k < end and mask[p + k] == 1
                assert bool(blocks.scored[a, k]) == scored, f"seed {seed} anchor {p} slot {k}"
                if scored:
                    assert int(blocks.labels[a, k]) == ids[p + k]


@pytest.mark.parametrize(("window", "causal"), [(0, False), (24, True)])
def test_gathered_attention_equals_attention_under_the_dense_mask_with_its_gradients(
    window: int, causal: bool
) -> None:
    cfg, batch, blocks, ctx_capacity, max_anchors = random_case(3)
    builder = BlockMaskBuilder(
        ctx_capacity, max_anchors, cfg.block_size, (window,), torch.device("cpu"), causal
    )
    mask = builder.build(blocks.ctx_lo, blocks.ctx_hi, blocks.anchor, gathered=True)[window]
    dense = reference_mask(blocks, batch, ctx_capacity, max_anchors, cfg.block_size, window, causal)
    q_len, kv_len = dense.shape
    generator = torch.Generator().manual_seed(0)
    # 4 query heads over 2 key heads, as the drafters group them.
    q, k, v = (
        torch.randn(1, heads, rows, 8, generator=generator, dtype=torch.float64)
        for heads, rows in ((4, q_len), (2, kv_len), (2, kv_len))
    )
    grad_out = torch.randn(1, 4, q_len, 8, generator=generator, dtype=torch.float64)

    def run(attend) -> list[torch.Tensor]:
        inputs = [x.clone().requires_grad_() for x in (q, k, v)]
        out = attend(*inputs)
        out.backward(grad_out)
        return [out.detach(), *(x.grad for x in inputs)]

    gathered = run(lambda *qkv: _gathered_attend(*qkv, mask=mask, scale=0.3))
    reference = run(
        lambda *qkv: F.scaled_dot_product_attention(
            *qkv, attn_mask=torch.from_numpy(dense), scale=0.3, enable_gqa=True
        )
    )
    for got, expected in zip(gathered, reference, strict=True):
        torch.testing.assert_close(got, expected)


def test_a_compiled_builder_classifies_the_tiles_of_every_batch_as_the_eager_one() -> None:
    """The compiled drafter's builder (its tile classification through torch.compile;
    Inductor's kernels are the GPU's, so Dynamo's graph runs as is here) reads each
    batch's bounds, not the first batch's: batches of one long document, then of short
    ones, each equal to the eager builder's masks, in a full layer and a causal sliding
    one (every branch of the rule)."""
    cfg = DrafterConfig(block_size=16, num_anchors=64, anchor_ref_len=1024)
    ctx_capacity, max_anchors = layout_sizes(cfg, 1024)
    compiled, eager = (
        BlockMaskBuilder(ctx_capacity, max_anchors, 16, (0, 24), torch.device("cpu"), True, backend)
        for backend in ("aot_eager", None)
    )
    full_tiles = []
    for seed, lengths in enumerate(([1024], [256] * 4, [100, 300, 600])):
        batch = random_packed_batch(lengths, 4, VOCAB, "cpu", torch.float32, seed)
        generator = torch.Generator().manual_seed(seed)
        blocks = build_blocks(batch, generator, cfg, MASK_ID, ctx_capacity, max_anchors)
        got, expected = (
            builder.build(blocks.ctx_lo, blocks.ctx_hi, blocks.anchor)
            for builder in (compiled, eager)
        )
        for window, name in itertools.product((0, 24), KV_BLOCK_FIELDS + Q_BLOCK_FIELDS):
            torch.testing.assert_close(
                getattr(got[window], name), getattr(expected[window], name), msg=name
            )
        full_tiles.append(int(expected[0].full_kv_num_blocks.sum()))
    assert len(set(full_tiles)) == 3, "the batches' masks differ, so a stale one would show"
