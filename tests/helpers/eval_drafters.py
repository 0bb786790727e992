"""Drafters for the evaluation tests: an untrained one written as ringtrain-eval reads it,
and a scripted one whose proposals are right on a known number of positions."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from ringtrain.drafter import DFlashDrafter, drafter_spec_from_target
from ringtrain.drafter.config import DrafterConfig
from ringtrain.drafter.hf_config import hf_config_dict
from ringtrain.target import read_target_config
from tests.helpers.tiny_drafter import PAPER_DRAFTER

TAPS = [1, 3, 5]
BLOCK = 6  # the scripted drafter's block size


def write_drafter(directory: Path, target_dir: Path, block_size: int = 8) -> Path:
    """An untrained one-layer DFlash drafter of the target in `target_dir` (taps TAPS,
    seeded), saved as ringtrain-eval reads a drafter."""
    spec = drafter_spec_from_target(
        read_target_config(target_dir),
        DrafterConfig(**PAPER_DRAFTER, num_layers=1, block_size=block_size),
        TAPS,
    )
    torch.manual_seed(0)
    model = DFlashDrafter(spec)
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps(hf_config_dict(spec)))
    save_file(model.state_dict(), str(directory / "model.safetensors"))
    return directory


class ScriptedDrafter:
    """Proposes the known greedy continuation, right on its first ``correct`` positions only.

    Records every context it is given, to check the features against a full forward."""

    def __init__(self, sequence: list[int], correct: int, vocab_size: int) -> None:
        self.block_size = BLOCK
        self.mask_token_id = vocab_size - 1
        self.tap_layers = TAPS
        self.sequence = sequence
        self.correct = correct
        self.vocab_size = vocab_size
        self.contexts: list[torch.Tensor] = []

    def propose(self, context: torch.Tensor, block: torch.Tensor, start: int) -> torch.Tensor:
        assert context.shape[0] == start
        assert int(block[0]) == self.sequence[start]
        assert (block[1:] == self.mask_token_id).all()
        self.contexts.append(context.clone())
        truth = self.sequence[start + 1 : start + self.block_size]
        truth = truth + [0] * (self.block_size - 1 - len(truth))
        drafts = [t if k < self.correct else (t + 1) % self.vocab_size for k, t in enumerate(truth)]
        return torch.tensor(drafts, dtype=torch.long, device=context.device)
