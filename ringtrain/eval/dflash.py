"""A trained DFlash drafter as the BlockDrafter of speculative decoding.

The drafter directory is a checkpoint (config.json with ``dflash_config`` +
model.safetensors, as the trainer writes and DFlash inference code reads), a
checkpoints root, or a run directory (its newest complete checkpoint is used). Only the
config and weights are read, so an exported drafter without training state works too.
The frozen embedding and LM head are the loaded target's own tensors.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from ringtrain.checkpoint import checkpoint_spec, latest_checkpoint
from ringtrain.checkpoint.layout import CONFIG_FILE, WEIGHTS_FILE
from ringtrain.drafter import DrafterSpec, FrozenHead, build_drafter
from ringtrain.eval.graphed_drafts import FixedShapeProposals
from ringtrain.eval.target import VerifyingTarget
from ringtrain.generate.sampling import TokenSampler


def resolve_drafter_dir(path: str | Path) -> Path:
    """The checkpoint directory named by ``path`` (itself, or the newest one below it)."""
    path = Path(path).expanduser()
    if (path / CONFIG_FILE).is_file() and (path / WEIGHTS_FILE).is_file():
        return path
    for root in (path, path / "checkpoints"):
        latest = latest_checkpoint(root)
        if latest is not None:
            return latest
    raise FileNotFoundError(
        f"{path}: not a drafter checkpoint ({CONFIG_FILE} + {WEIGHTS_FILE}) and no complete step_N "
        f"checkpoint below it or below {path / 'checkpoints'}; pass a checkpoint directory "
        f"or the run directory of a training run"
    )


def read_drafter_spec(path: str | Path) -> DrafterSpec:
    """The drafter's architecture, taps, block size and mask id from its config.json."""
    return checkpoint_spec(resolve_drafter_dir(path))


def check_compatible(spec: DrafterSpec, target: VerifyingTarget, source: str) -> None:
    """Raise ValueError when the drafter was not trained for this target's shape."""
    config = target.model.config
    pairs = {
        "hidden_size": (spec.hidden_size, target.hidden_size),
        "vocab_size": (spec.vocab_size, target.vocab_size),
        "num_target_layers": (spec.num_target_layers, int(config.num_hidden_layers)),
    }
    for name, (drafter_value, target_value) in pairs.items():
        if drafter_value != target_value:
            raise ValueError(
                f"{source}: the drafter has {name} = {drafter_value} but the target has "
                f"{target_value}; evaluate the drafter with the target it was trained on"
            )


class DFlashBlockDrafter:
    """Block proposals of a drafter (any of drafter/arch/) over one
    sequence's target features; the drafter's own `propose` picks the tokens (DFlash: each
    slot's argmax; DFlash2: its path selector's walk), and verification stays a chain.
    At a temperature they are drawn instead (ringtrain.eval.draft_sampling). Proposals
    run over a fixed-size context, as CUDA graphs on CUDA
    (ringtrain.eval.graphed_drafts)."""

    def __init__(self, proposals: FixedShapeProposals) -> None:
        spec = proposals.model.spec
        self.block_size = spec.block_size
        self.mask_token_id = spec.mask_token_id
        self.tap_layers = list(spec.tap_layers)
        self.proposals = proposals

    def propose(self, context: torch.Tensor, block: torch.Tensor, start: int) -> torch.Tensor:
        """Draft tokens [B-1] for block positions 1..B-1 (see BlockDrafter)."""
        return self.proposals.propose(context, block, start)

    def propose_sampled(
        self, context: torch.Tensor, block: torch.Tensor, start: int, sampler: TokenSampler
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Drafts [B-1] drawn at the sampler's settings and their distributions [B-1, V]
        (see ringtrain.eval.sampled.SamplingDrafter)."""
        return self.proposals.propose_sampled(context, block, start, sampler)


def load_dflash_drafter(
    path: str | Path, target: VerifyingTarget, max_positions: int = 4096
) -> DFlashBlockDrafter:
    """Load a drafter checkpoint for ``target`` (whose embedding and LM head it shares)."""
    directory = resolve_drafter_dir(path)
    spec = read_drafter_spec(directory)
    check_compatible(spec, target, str(directory))
    if list(spec.tap_layers) != target.tap_layers:
        raise ValueError(
            f"{directory}: the drafter taps layers {list(spec.tap_layers)} but the target was "
            f"loaded with taps {target.tap_layers}; load the target with the drafter's taps"
        )
    with torch.device(target.device):
        model = build_drafter(spec)
    model.load_state_dict(load_file(str(directory / WEIGHTS_FILE), device=str(target.device)))
    model.eval().requires_grad_(False)
    if target.device.type != "cuda":
        model.to(target.dtype)  # CUDA runs it under bf16 autocast; elsewhere in the target's dtype
    lm = target.model
    head = FrozenHead(lm.get_input_embeddings().weight, lm.get_output_embeddings().weight)
    graphed = target.device.type == "cuda"
    proposals = FixedShapeProposals(
        model, head, max_positions, target.tap_width, target.dtype, graphed
    )
    return DFlashBlockDrafter(proposals)
