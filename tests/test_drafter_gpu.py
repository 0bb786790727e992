"""GPU checks of the compiled drafter path: flex_attention equals the dense path, no recompiles."""

from __future__ import annotations

import math
import warnings

import msgspec
import pytest
import torch

from ringtrain.compile_caches import compiled_graph_count
from ringtrain.drafter import (
    FrozenHead,
    block_objective,
    build_drafter,
    build_optimizer,
    drafter_spec_from_target,
    optimizer_step,
)
from ringtrain.drafter.block_step import prepare_batch
from ringtrain.drafter.config import DrafterConfig
from ringtrain.drafter.masks import GatheredMask
from ringtrain.drafter.row_topk import row_topk
from ringtrain.packed_batch import random_packed_batch
from tests.helpers.tiny_drafter import paper_optim

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

TARGET = {
    "hidden_size": 256,
    "vocab_size": 1024,
    "num_hidden_layers": 12,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "intermediate_size": 512,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1e6,
}
MAX_TOKENS = 1024


def setup(windows: list[int], architecture: str = "dflash"):
    cfg = DrafterConfig(
        num_layers=2, block_size=16, num_anchors=64, anchor_ref_len=512,
        sliding_windows=windows, loss_chunk=512, architecture=architecture,
    )  # fmt: skip
    torch.manual_seed(0)
    model = build_drafter(drafter_spec_from_target(TARGET, cfg, [1, 5, 9])).cuda()
    head = FrozenHead.random(1024, 256, "cuda", torch.bfloat16)
    return cfg, model, head


def test_flex_attention_matches_gathered_attention_on_gpu() -> None:
    cfg, model, head = setup([0, 64])
    batch = random_packed_batch([400, 300, 200], 3 * 256, 1024, "cuda", torch.float32, 0)
    blocks, _, workspace = prepare_batch(
        model, batch,
        torch.Generator("cuda").manual_seed(0), cfg, MAX_TOKENS,
    )  # fmt: skip
    by_window = workspace.builder.build(blocks.ctx_lo, blocks.ctx_hi, blocks.anchor, gathered=True)
    gathered_masks = tuple(by_window[w] for w in model.spec.sliding_windows)
    args = (blocks.ctx_features, blocks.ctx_positions, head.embed[blocks.block_ids].float(),
            blocks.block_positions)  # fmt: skip
    with torch.no_grad():
        gathered = model(*args, gathered_masks)
        flex_masks = workspace.builder.build(blocks.ctx_lo, blocks.ctx_hi, blocks.anchor)
        flex = torch.compile(model, dynamic=False)(
            *args, tuple(flex_masks[w] for w in model.spec.sliding_windows)
        )
    valid = blocks.valid.repeat_interleave(cfg.block_size)
    # Loose: Triton may run fp32 dots as TF32; the exact mask equality is tested on CPU.
    torch.testing.assert_close(flex[valid], gathered[valid], rtol=1e-2, atol=1e-2)


def test_an_eager_drafter_on_gpu_attends_over_gathered_keys_not_unfused_flex() -> None:
    cfg, model, head = setup([0, 64])
    cfg = msgspec.structs.replace(cfg, compile=False)
    batch = random_packed_batch([400, 300, 200], 3 * 256, 1024, "cuda", torch.float32, 0)
    generator = torch.Generator("cuda").manual_seed(0)
    _, masks, _ = prepare_batch(model, batch, generator, cfg, MAX_TOKENS)
    assert all(isinstance(mask, GatheredMask) for mask in masks)
    with warnings.catch_warnings():
        # flex_attention run without torch.compile warns that it materialises the scores.
        warnings.simplefilter("error", UserWarning)
        sums = block_objective(model, head, batch, generator, cfg, MAX_TOKENS)
        loss = sums.loss_sum / sums.weight_sum
        loss.backward()
    assert torch.isfinite(loss)


@pytest.mark.parametrize("architecture", ["dflash", "dflash2"])
def test_compiled_training_never_recompiles_across_document_layouts(architecture: str) -> None:
    cfg, model, head = setup([0, 0], architecture)
    optim_cfg = paper_optim(warmup_fraction=0.0)
    optimizer, scheduler = build_optimizer(model, optim_cfg, total_steps=20)
    generator = torch.Generator("cuda").manual_seed(0)
    layouts = [[512, 512], [1000], [100, 200, 300, 400], [7, 900], [333, 333, 333], [64] * 16]

    def step(lengths: list[int], seed: int) -> float:
        batch = random_packed_batch(lengths, 3 * 256, 1024, "cuda", torch.bfloat16, seed)
        sums = block_objective(
            model, head, batch, generator, cfg,
            max_tokens=MAX_TOKENS,
        )  # fmt: skip
        (sums.loss_sum / sums.weight_sum).backward()
        optimizer_step(model, optimizer, scheduler, optim_cfg)
        return float(sums.loss_sum / sums.weight_sum)

    step(layouts[0], 0)
    step(layouts[1], 1)
    before = compiled_graph_count()
    losses = [step(lengths, 2 + i) for i, lengths in enumerate(layouts * 2)]
    assert compiled_graph_count() == before
    assert all(torch.isfinite(torch.tensor(losses)))


@pytest.mark.parametrize("name", ["adamw", "muon"])
def test_the_optimizer_step_is_queued_without_waiting_for_the_gpu(name: str) -> None:
    """build_optimizer's choice on CUDA clips and skips inside its step: a step after the
    first (which creates the optimiser's state) runs under CUDA's sync debug mode set to
    error, so any host read of the norm, or any other wait, fails it."""
    model = setup([0, 0])[1]
    optim_cfg = paper_optim(warmup_fraction=0.0, name=name)
    optimizer, scheduler = build_optimizer(model, optim_cfg, total_steps=4)
    norms = []
    for step in range(2):
        for param in model.parameters():
            param.grad = torch.randn_like(param)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error" if step else "default")
        try:
            norms.append(
                optimizer_step(
                    model, optimizer, scheduler, optim_cfg, clip_in_step=True, grads_to_none=True
                )
            )
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert all(math.isfinite(float(norm)) for norm in norms)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
def test_row_topk_kernel_ranks_as_torch_topk_does(compiled: bool) -> None:
    """The one-kernel top-k of short rows (DFlash2's candidates) picks the entries
    torch.topk picks, largest first, also inside a compiled function; ties and -inf
    entries give k distinct ids, a NaN ranks first."""
    generator = torch.Generator("cuda").manual_seed(0)
    rank = torch.compile(lambda v, k: row_topk(v, k), fullgraph=True) if compiled else row_topk
    for rows, width, k in [(4099, 768, 16), (1000, 1024, 16), (7, 20, 20)]:
        values = torch.randn(rows, width, device="cuda", generator=generator)
        ids = rank(values, k)
        assert torch.equal(ids, values.topk(k, dim=-1).indices)
    ties = torch.tensor([[1.0, 3.0, 3.0, -math.inf, -math.inf, 0.0]], device="cuda")
    ranked = rank(ties.bfloat16(), 6)[0].tolist()
    assert ranked[:2] == [1, 2] and ranked[2:4] == [0, 5] and sorted(ranked) == list(range(6))
    with_nan = torch.tensor([[1.0, math.nan, 2.0, -0.5, math.inf]], device="cuda")
    assert rank(with_nan, 5)[0].tolist() == [1, 4, 2, 0, 3]  # NaN first, as torch.topk
