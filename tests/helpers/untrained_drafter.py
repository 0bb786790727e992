"""The drafter a training run started from, written for ringtrain-eval: the baseline that
the run's trained drafter must beat on the same prompts."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from ringtrain.checkpoint import checkpoint_spec, latest_checkpoint
from ringtrain.checkpoint.layout import CONFIG_FILE, WEIGHTS_FILE
from ringtrain.drafter import load_frozen_head, seeded_drafter


def write_untrained_drafter(run_dir: Path, target: Path, output: Path) -> Path:
    """The drafter of `run_dir`'s newest checkpoint as its run built it before any step
    (seeded with the run's seed, its output fitted to the target's head), saved in
    `output` with that checkpoint's config."""
    checkpoint = latest_checkpoint(run_dir / "checkpoints")
    assert checkpoint is not None, f"{run_dir} has no checkpoint"
    seed = json.loads((run_dir / "config.json").read_text())["run"]["seed"]
    cpu = torch.device("cpu")
    model = seeded_drafter(checkpoint_spec(checkpoint), cpu, seed)
    model.fit_output_scale(load_frozen_head(target, cpu, torch.float32))
    output.mkdir(parents=True)
    shutil.copy(checkpoint / CONFIG_FILE, output / CONFIG_FILE)
    weights = {name: tensor.contiguous() for name, tensor in model.state_dict().items()}
    save_file(weights, str(output / WEIGHTS_FILE))
    return output
