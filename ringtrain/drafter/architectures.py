"""The drafter architectures a run can train, by name (`DrafterSpec.architecture`).

`build_drafter` makes the model a spec names and `drafter_of` finds it inside a
DistributedDataParallel wrapper. A new architecture is a class (an nn.Module built from a
DrafterSpec, keeping it as `.spec`, with the training forward of DFlashDrafter) and an
entry in `ARCHITECTURES`.
"""

from __future__ import annotations

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


def drafter_of(model: nn.Module) -> nn.Module:
    """The drafter itself, also inside DistributedDataParallel (which wraps it in .module)."""
    inner = getattr(model, "module", model)
    if not isinstance(inner, tuple(ARCHITECTURES.values())):
        raise TypeError(
            f"expected a drafter ({', '.join(c.__name__ for c in ARCHITECTURES.values())}), "
            f"got {type(inner).__name__}"
        )
    return inner
