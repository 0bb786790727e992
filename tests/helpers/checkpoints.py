"""A small drafter's checkpointable state, and what a crash mid-save leaves behind."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from ringtrain.checkpoint.layout import WEIGHTS_FILE
from ringtrain.drafter import (
    DFlashDrafter,
    build_optimizer,
    drafter_spec_from_target,
    optimizer_step,
)
from ringtrain.drafter.config import DrafterConfig
from tests.helpers.tiny_drafter import PAPER_DRAFTER, all_visible, paper_optim

TARGET = {
    "hidden_size": 16,
    "vocab_size": 40,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 24,
    "rms_norm_eps": 1e-5,
    "rope_theta": 5e5,
}
CFG = DrafterConfig(
    **PAPER_DRAFTER, num_layers=2, block_size=4, sliding_windows=[0, 8], mask_token_id=39
)


def trained_state(steps: int):
    """(spec, drafter, optimizer, scheduler) of a drafter of CFG after `steps` AdamW steps
    on a random regression loss (the same every call)."""
    torch.manual_seed(0)
    spec = drafter_spec_from_target(TARGET, CFG, [1, 2, 4])
    model = DFlashDrafter(spec)
    optimizer, scheduler = build_optimizer(model, paper_optim(), total_steps=10)
    for _ in range(steps):
        model(
            torch.randn(5, 48), torch.arange(5), torch.randn(8, 16), torch.arange(5, 13),
            all_visible(8, 13, 2),
        ).square().mean().backward()  # fmt: skip
        optimizer_step(model, optimizer, scheduler, paper_optim())
    return spec, model, optimizer, scheduler


def plant_torn_checkpoints(root: Path, complete: Path) -> None:
    """What a crash mid-save can leave: a temporary copy and a step dir missing a file."""
    shutil.copytree(complete, root / ".tmp-step_99999990-12345")
    torn = root / "step_99999999"
    shutil.copytree(complete, torn)
    (torn / WEIGHTS_FILE).unlink()
