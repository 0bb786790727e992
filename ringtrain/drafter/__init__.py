"""The drafter: architectures, block objective, held-out evaluation, optimiser (its
checkpoints: ringtrain.checkpoint)."""

from ringtrain.drafter.arch import build_drafter, seeded_drafter
from ringtrain.drafter.arch.dflash.model import DFlashDrafter
from ringtrain.drafter.block_step import block_objective
from ringtrain.drafter.head import FrozenHead, load_frozen_head
from ringtrain.drafter.heldout import EvalSums, evaluate_batch
from ringtrain.drafter.hf_config import drafter_spec_from_target
from ringtrain.drafter.optim import build_optimizer, optimizer_step
from ringtrain.drafter.spec import DrafterSpec
from ringtrain.drafter.sums import ObjectiveSums

__all__ = [
    "DFlashDrafter",
    "DrafterSpec",
    "EvalSums",
    "FrozenHead",
    "ObjectiveSums",
    "block_objective",
    "build_drafter",
    "build_optimizer",
    "drafter_spec_from_target",
    "evaluate_batch",
    "load_frozen_head",
    "optimizer_step",
    "seeded_drafter",
]
