"""The drafter architectures a run can train ([drafter] architecture), one folder each.

`ARCHITECTURES` is the one table of them (each folder's `ARCHITECTURE`: see
drafter/arch/base.py for what one holds, docs/architectures.md for adding one).
`build_drafter` makes the model a spec names, `seeded_drafter` makes it on a device with
its initialisation drawn from a seed alone, and `drafter_of` finds it inside a
DistributedDataParallel wrapper.
"""

from __future__ import annotations

import torch
from torch import nn

from ringtrain.choices import choice_table
from ringtrain.drafter.arch.base import Architecture
from ringtrain.drafter.arch.dflash import ARCHITECTURE as DFLASH
from ringtrain.drafter.arch.dflash2 import ARCHITECTURE as DFLASH2
from ringtrain.drafter.config import DrafterConfig
from ringtrain.drafter.spec import DrafterSpec

ARCHITECTURES: dict[str, Architecture] = choice_table(
    DrafterConfig, "architecture", {"dflash": DFLASH, "dflash2": DFLASH2}
)
_UNKNOWN_KEYS = {
    name: missing
    for name, architecture in ARCHITECTURES.items()
    if (
        missing := set(architecture.settings.__struct_fields__)
        - set(DrafterConfig.__struct_fields__)
    )
}
if _UNKNOWN_KEYS:
    raise ImportError(
        f"architecture settings without a [drafter] key of the same name: {_UNKNOWN_KEYS}; "
        "add each to DrafterConfig (drafter/config.py)"
    )


def architecture_named(name: str) -> Architecture:
    """The architecture of that name; ValueError naming the known ones otherwise."""
    if name not in ARCHITECTURES:
        raise ValueError(
            f"drafter architecture {name!r} is unknown; use one of {sorted(ARCHITECTURES)}"
        )
    return ARCHITECTURES[name]


def build_drafter(spec: DrafterSpec) -> nn.Module:
    """A freshly initialised drafter of the architecture `spec` names."""
    return architecture_named(spec.architecture).model(spec)


def seeded_drafter(spec: DrafterSpec, device: torch.device, seed: int) -> nn.Module:
    """A fresh drafter built on `device` (initialised where it trains: a billion values
    on a CPU take long), its random initialisation drawn from `seed` alone: every rank,
    and every run, with the same seed on the same kind of device starts from the same
    weights. The caller's random state is left as it was (only this device's and the
    CPU's generators are forked: a rank's other GPUs are not its own)."""
    cuda = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda, device_type="cuda"), torch.device(device):
        torch.manual_seed(seed)
        return build_drafter(spec)


def drafter_of(model: nn.Module) -> nn.Module:
    """The drafter itself, also inside DistributedDataParallel (which wraps it in .module)."""
    inner = getattr(model, "module", model)
    models = tuple(architecture.model for architecture in ARCHITECTURES.values())
    if not isinstance(inner, models):
        raise TypeError(
            f"expected a drafter ({', '.join(c.__name__ for c in models)}), "
            f"got {type(inner).__name__}"
        )
    return inner
