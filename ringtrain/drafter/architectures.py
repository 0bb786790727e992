"""The drafter architectures a run can train, by name (`DrafterSpec.architecture`).

`build_drafter` makes the model a spec names, `seeded_drafter` makes it on a device with
its initialisation drawn from a seed alone, and `drafter_of` finds it inside a
DistributedDataParallel wrapper. A new architecture is a class (an nn.Module built from a
DrafterSpec, keeping it as `.spec`, with the training forward of DFlashDrafter) and an
entry in `ARCHITECTURES`.
"""

from __future__ import annotations

import torch
from torch import nn

from ringtrain.drafter.dflash2 import DFlash2Drafter
from ringtrain.drafter.model import DFlashDrafter
from ringtrain.drafter.spec import DrafterSpec

ARCHITECTURES: dict[str, type[nn.Module]] = {"dflash": DFlashDrafter, "dflash2": DFlash2Drafter}


def build_drafter(spec: DrafterSpec) -> nn.Module:
    """A freshly initialised drafter of the architecture `spec` names."""
    if spec.architecture not in ARCHITECTURES:
        raise ValueError(
            f"drafter architecture {spec.architecture!r} is unknown; use one of "
            f"{sorted(ARCHITECTURES)}"
        )
    return ARCHITECTURES[spec.architecture](spec)


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
    if not isinstance(inner, tuple(ARCHITECTURES.values())):
        raise TypeError(
            f"expected a drafter ({', '.join(c.__name__ for c in ARCHITECTURES.values())}), "
            f"got {type(inner).__name__}"
        )
    return inner
