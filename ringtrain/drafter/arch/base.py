"""What a drafter architecture is: the `Architecture` record each one fills in.

Everything that differs between architectures is here, by field, so the rest of the
drafter (the block step, the sums, the checkpoint's config.json, the trainer's records)
asks the architecture instead of naming one:

- its network (``model``), which also holds its greedy proposal rule (``propose``);
- its own spec fields (``settings``: [drafter] keys of the same names, written to and
  read from the checkpoint's dflash_config under ``hf_name``);
- its part of the block objective (``block_term``): the proposal rule under teacher
  forcing (which slots it gets right) and the loss parts it adds;
- the sums its block objective yields (``sums_type``: ObjectiveSums plus one field per
  loss part, which the step records and evaluation records then report by name);
- its start-up checks of [drafter] settings that only bite once a run trains
  (``check_limits``, beside drafter/limits.py's own).

An architecture is one folder under drafter/arch/ defining an ``ARCHITECTURE`` and one
line in the table (drafter/arch/__init__.py); docs/architectures.md gives the recipe.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from ringtrain.drafter.config import DrafterConfig
from ringtrain.drafter.spec import ArchitectureSettings
from ringtrain.drafter.sums import ObjectiveSums


class BlockTerm(Protocol):
    """An architecture's part of the block objective, beside each slot's cross-entropy."""

    # Candidate tokens per scored slot it needs: each row's top-k by logit, which the
    # head's chunked loss hands over, with their logits, from the logits it forms anyway
    # (0: none).
    top_k: int

    def __call__(
        self,
        rows: torch.Tensor,
        lm_head: torch.Tensor,
        labels: torch.Tensor,
        row_weights: torch.Tensor,
        candidates: torch.Tensor,
        candidate_logits: torch.Tensor,
        chunk: int,
    ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """(its loss parts by sums field, each added to the loss; whether its proposal
        rule gets each scored slot right under teacher forcing).

        rows [A * (B-1), H]: final hidden states of slots 1..B-1; labels [A, B]: the true
        tokens of slots 0..B-1; row_weights [A, B-1]: the objective's; candidates
        [A * (B-1), top_k] and candidate_logits, their logits; `chunk` rows at a time."""
        ...


@dataclass(frozen=True)
class Architecture:
    """One drafter architecture (see the module docstring)."""

    # config.json's "architectures" entry: what the serving engines load it as.
    hf_name: str
    # The network, built from a DrafterSpec: DFlashDrafter's training forward and
    # decoding entry points (draft_hidden, propose, ...).
    model: type[nn.Module]
    # Its own spec fields, taken from the [drafter] keys of the same names.
    settings: type[ArchitectureSettings] = ArchitectureSettings
    # Its block term, built from the drafter, the [drafter] config and the compile mode
    # its work may be compiled with (None: eager); None: proposals are each slot's argmax
    # and the loss is the slots' cross-entropy alone.
    block_term: Callable[[nn.Module, DrafterConfig, str | None], BlockTerm] | None = None
    # The sums of its block objective: a field per loss part its block term adds.
    sums_type: type[ObjectiveSums] = ObjectiveSums
    # Its checks of the [drafter] config given the scored slots of a step (anchors x
    # (block_size - 1)); raises ValueError naming the setting. None: nothing to check.
    check_limits: Callable[[DrafterConfig, int], None] | None = None

    def settings_of(self, cfg: DrafterConfig) -> ArchitectureSettings:
        """Its settings as the [drafter] config gives them."""
        return self.settings(**{key: getattr(cfg, key) for key in self.settings.__struct_fields__})
