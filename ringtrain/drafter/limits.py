"""What a drafter can hold, checked at start-up: values that pass the config's bounds but
would fail a run once its ring is up.

- the static anchor layout must fit the context (drafter/blocks.py layout_sizes);
- the drafter's parameters with their training state (fp32 weights, gradients and two
  optimiser moments: 16 bytes each) must fit the memory of the device it trains on;
  the parameters are counted on the meta device, so nothing is allocated;
- a step of optim.lr must stay finite in float32, the weights' type, also after Muon
  scales it for its largest matrix (torch's "match_rms_adamw": 0.2 x sqrt(max(rows,
  cols)));
- the architecture's own checks (its ``check_limits``, e.g. DFlash2's selector loss
  weight, drafter/arch/dflash2/selector.py).

`check_limits` raises ValueError with one line naming the setting, the bound and why.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import torch

from ringtrain.drafter.arch import architecture_named, build_drafter
from ringtrain.drafter.blocks import layout_sizes
from ringtrain.drafter.config import DrafterConfig, OptimConfig
from ringtrain.drafter.spec import DrafterSpec

FLOAT32_MAX = torch.finfo(torch.float32).max
# fp32 weights, fp32 gradients and two fp32 optimiser moments per parameter.
TRAINING_BYTES_PER_PARAMETER = 16
# torch's Muon "match_rms_adamw" rule scales a matrix's step by this times sqrt(max dim).
MUON_RMS_FACTOR = 0.2


def check_limits(
    drafter: DrafterConfig,
    optim: OptimConfig,
    spec: DrafterSpec,
    token_budget: int,
    device: torch.device,
) -> None:
    """Raise ValueError if the settings give a drafter its device cannot train (see the
    module docstring)."""
    _, max_anchors = layout_sizes(drafter, token_budget)
    with torch.device("meta"):
        model = build_drafter(spec)
    parameters = dict(model.named_parameters())
    _check_memory(parameters, device)
    _check_lr(optim, parameters)
    check_architecture = architecture_named(spec.architecture).check_limits
    if check_architecture is not None:
        check_architecture(drafter, max_anchors * (spec.block_size - 1))


def _check_memory(parameters: dict[str, torch.nn.Parameter], device: torch.device) -> None:
    count = sum(p.numel() for p in parameters.values())
    needed = count * TRAINING_BYTES_PER_PARAMETER
    memory, where = device_memory(device)
    if needed <= memory:
        return
    name, largest = max(parameters.items(), key=lambda item: item[1].numel())
    raise ValueError(
        f"the [drafter] settings give a drafter of {count:,} parameters, "
        f"{needed / 2**30:,.1f} GiB to train ({TRAINING_BYTES_PER_PARAMETER} bytes each), "
        f"more than the {memory / 2**30:,.1f} GiB of {where}; its largest tensor is {name} "
        f"{list(largest.shape)}: lower the setting that sizes it"
    )


def device_memory(device: torch.device) -> tuple[int, str]:
    """(bytes of memory, its name in words) of the device a drafter trains on."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory, f"GPU {device}"
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024, "this host's memory"
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "this host's memory"


def _check_lr(optim: OptimConfig, parameters: dict[str, torch.nn.Parameter]) -> None:
    scale, why = 1.0, ""
    if optim.name == "muon":
        widest = max((max(p.shape) for p in parameters.values() if p.ndim >= 2), default=1)
        scale = MUON_RMS_FACTOR * math.sqrt(widest)
        why = f" x {scale:.3g} (Muon's scale for its widest matrix, {widest})"
    largest = FLOAT32_MAX / scale
    if optim.lr > largest:
        raise ValueError(
            f"optim.lr = {optim.lr:g}: a step of lr{why} must stay below float32's "
            f"largest value {FLOAT32_MAX:.3g} (the weights' type), so lr <= {largest:.3g}; "
            "use a learning rate like the default 6e-4"
        )
