"""Loading a drafter checkpoint: the drafter, its spec and its training state.

`load_checkpoint` takes a checkpoint directory, or a checkpoints root (then its newest
good checkpoint); `saved_optimizer_state` maps the optimiser state from the file for the
checks before a resume.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import nn

from ringtrain.checkpoint.layout import CONFIG_FILE, STATE_FILE, WEIGHTS_FILE
from ringtrain.checkpoint.resume_record import ResumeRecord, read_resume_record
from ringtrain.checkpoint.state import load_state, restore_rng_states
from ringtrain.checkpoint.verify import checkpoint_spec, latest_checkpoint
from ringtrain.drafter.arch import build_drafter
from ringtrain.drafter.spec import DrafterSpec


@dataclass
class LoadedCheckpoint:
    """A loaded drafter (None when loaded without weights), its spec and training state."""

    path: Path
    spec: DrafterSpec
    model: nn.Module | None
    step: int
    training_state: dict[str, Any]

    @property
    def record(self) -> ResumeRecord:
        """The resume record given to save_checkpoint (data cursors, ...)."""
        return read_resume_record(self.path)

    @property
    def saved_schedule(self) -> dict[str, Any]:
        """The learning-rate scheduler's state dict at the save (what it was, for comparison:
        a resumed run rebuilds its schedule from the config, see resume.py)."""
        return self.training_state["scheduler"]

    def restore(self, optimizer: torch.optim.Optimizer, rng: bool = True) -> None:
        """Load the optimiser state (moments and settings as saved) and the global RNG
        states; resume.py then applies the config's settings and schedule."""
        optimizer.load_state_dict(self.training_state["optimizer"])
        if rng:
            restore_rng_states(self.training_state["rng"])


def saved_optimizer_state(checkpoint: str | Path) -> dict[str, Any]:
    """The optimiser state dict in a checkpoint directory, its tensors mapped from the file
    rather than read (cheap: for checks before a resume)."""
    return load_state(Path(checkpoint) / STATE_FILE, mmap=True)["optimizer"]


def load_checkpoint(
    path_or_root: str | Path, device: torch.device | str, weights: bool = True
) -> LoadedCheckpoint:
    """Load a checkpoint directory, or the latest complete one under a checkpoints root.

    With weights=False only the spec and the training state are read (model is None),
    e.g. for a tool that needs just the step and the training state.
    """
    path = Path(path_or_root)
    if not (path / CONFIG_FILE).is_file():
        latest = latest_checkpoint(path)
        if latest is None:
            raise FileNotFoundError(
                f"{path}: neither a checkpoint directory (no {CONFIG_FILE}) nor a root "
                "holding a complete step_N checkpoint"
            )
        path = latest
    spec = checkpoint_spec(path)
    model = None
    if weights:
        with torch.device(device):
            model = build_drafter(spec)
        model.load_state_dict(load_file(str(path / WEIGHTS_FILE), device=str(device)))
    state = load_state(path / STATE_FILE)
    return LoadedCheckpoint(
        path=path, spec=spec, model=model, step=state["step"], training_state=state
    )
