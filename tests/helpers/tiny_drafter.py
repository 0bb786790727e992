"""The tiny fp64 drafter, its batch and its training loop, shared by the CPU drafter tests."""

from __future__ import annotations

import json
from collections.abc import Iterable

import torch

from ringtrain.drafter import (
    DFlashDrafter,
    FrozenHead,
    ObjectiveSums,
    block_objective,
    build_optimizer,
    drafter_spec_from_target,
    optimizer_step,
)
from ringtrain.drafter.config import PAPER_DRAFTER, PAPER_OPTIM, DrafterConfig, OptimConfig
from ringtrain.drafter.masks import GatheredMask
from ringtrain.packed_batch import PackedBatch, random_packed_batch

TARGET = {
    "hidden_size": 32,
    "vocab_size": 64,
    "num_hidden_layers": 8,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "intermediate_size": 64,
    "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
}
TAPS = [1, 3, 5]
MAX_TOKENS = 160
DOCS = [70, 45, 30]


# The paper's recipe (PAPER_DRAFTER, PAPER_OPTIM) is what the tests of DFlash's and
# AdamW's mechanics check (the configs' defaults are DFlash2, D-PACE, Muon and
# warmup-stable-decay; their own tests name them); here as a training run's --set overrides.
PAPER_SETS = [
    f"{section}.{key}={json.dumps(value)}"
    for section, values in (("drafter", PAPER_DRAFTER), ("optim", PAPER_OPTIM))
    for key, value in values.items()
]


def paper_optim(**overrides) -> OptimConfig:
    """The paper's AdamW with a cosine schedule, with ``overrides``."""
    return OptimConfig(**{**PAPER_OPTIM, **overrides})


def make_cfg(**overrides) -> DrafterConfig:
    """The paper's drafter: two layers (full and 24-token window), blocks of 8, 6 anchors
    per 40 tokens, eager."""
    values = {
        **PAPER_DRAFTER, "num_layers": 2, "block_size": 8, "num_anchors": 6,
        "anchor_ref_len": 40, "sliding_windows": [0, 24], "loss_chunk": 40, "compile": False,
    }  # fmt: skip
    return DrafterConfig(**{**values, **overrides})


def make_setup(
    seed: int = 0, **overrides
) -> tuple[DrafterConfig, DFlashDrafter, FrozenHead, PackedBatch]:
    """(config, fp64 drafter, random head, batch of DOCS with loss-mask holes) for ``seed``."""
    cfg = make_cfg(**overrides)
    torch.manual_seed(seed)
    model = DFlashDrafter(drafter_spec_from_target(TARGET, cfg, TAPS)).double()
    gen = torch.Generator().manual_seed(seed)
    embed, lm_head = torch.randn(2, 64, 32, generator=gen, dtype=torch.float64) * 0.5
    batch = random_packed_batch(DOCS, 3 * 32, 64, "cpu", torch.float64, seed, mask_holes=8)
    return cfg, model, FrozenHead(embed, lm_head), batch


def objective(
    model: DFlashDrafter,
    head: FrozenHead,
    batch: PackedBatch,
    cfg: DrafterConfig,
    seed: int,
    max_tokens: int = MAX_TOKENS,
) -> ObjectiveSums:
    """block_objective on ``batch``, its anchors drawn by a CPU generator seeded ``seed``."""
    return block_objective(
        model, head, batch, torch.Generator().manual_seed(seed),
        cfg, max_tokens=max_tokens,
    )  # fmt: skip


def train(
    model: DFlashDrafter,
    head: FrozenHead,
    batch: PackedBatch,
    cfg: DrafterConfig,
    seeds: Iterable[int],
    max_tokens: int = MAX_TOKENS,
) -> list[float]:
    """One optimizer step (lr 1e-2, no warm-up) per anchor seed; returns the step losses."""
    seeds = list(seeds)
    optim_cfg = paper_optim(lr=1e-2, warmup_fraction=0.0)
    optimizer, scheduler = build_optimizer(model, optim_cfg, len(seeds))
    losses = []
    for seed in seeds:
        sums = objective(model, head, batch, cfg, seed, max_tokens)
        (sums.loss_sum / sums.weight_sum).backward()
        optimizer_step(model, optimizer, scheduler, optim_cfg)
        losses.append(float(sums.loss_sum.detach() / sums.weight_sum))
    return losses


def all_visible(queries: int, keys: int, layers: int) -> list[GatheredMask]:
    """Per layer: one block of ``queries`` rows that sees all ``keys`` keys of [ctx ; block]."""
    mask = GatheredMask(torch.arange(keys)[None], torch.ones(1, queries, keys, dtype=torch.bool))
    return [mask] * layers
