"""Which Gated DeltaNet implementation a hybrid target runs (``target.linear_attention``).

transformers runs a hybrid target's Gated DeltaNet layers either with
flash-linear-attention's Triton kernels (bound when the modeling module is imported, where
FLA is installed) or with its own torch implementation. FLA's kernels are the fast choice
for real targets but autotune at the first forward (about 40 s for the tiny built-in
target on an H200 with empty caches); a tiny target gains nothing from them, so
``"torch"`` swaps transformers' own implementation back in for one loaded model.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
from collections.abc import Callable

import torch
from torch import nn
from transformers import PretrainedConfig

from ringtrain.target.model_dir import TargetLoadError
from ringtrain.target.structure import is_hybrid

log = logging.getLogger(__name__)

# The module-level functions transformers' hybrid models call for the Gated DeltaNet
# recurrence. Each is wrapped to dispatch to FLA when it was importable; the wrapper
# keeps the torch function as __wrapped__.
GATED_DELTA_RULE_FUNCTIONS = ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule")


def linear_attention_backend(
    config: PretrainedConfig, device: torch.device, choice: str = "auto"
) -> str | None:
    """The Gated DeltaNet implementation a target runs: "fla", "torch" or None (not hybrid).

    ``choice`` is ``target.linear_attention``: "auto" takes FLA where it is installed,
    "fla" requires it, "torch" is transformers' own implementation. Raises when FLA is
    importable but the target runs on CPU: transformers binds FLA's Triton functions at
    import time, and Triton has no CPU driver, so FLA must not be installed in CPU-only
    environments.
    """
    if not is_hybrid(config):
        return None
    fla_installed = importlib.util.find_spec("fla") is not None
    if fla_installed and device.type != "cuda":
        raise TargetLoadError(
            "flash-linear-attention is installed but the hybrid target runs on "
            f"{device.type}; its Triton kernels need CUDA. Uninstall flash-linear-attention "
            "in CPU-only environments (install it only where CUDA is present)"
        )
    if choice == "fla" and not fla_installed:
        raise TargetLoadError(
            'target.linear_attention = "fla" but flash-linear-attention is not installed: '
            'install the \'gpu\' extra, or use "auto" or "torch"'
        )
    if choice == "torch":
        return "torch"
    return "fla" if fla_installed else "torch"


def use_torch_linear_attention(model: nn.Module) -> int:
    """Make the Gated DeltaNet layers of ``model`` run transformers' torch implementation;
    returns how many dispatching functions were replaced (0: none found, so the layers
    run whatever transformers bound).

    The functions are module-level in the model's modeling module, so the swap holds for
    every model of that class in this process (a target rank loads one target)."""
    modules = {sys.modules[type(layer).__module__] for layer in model.modules()}
    swapped = 0
    for module in modules:
        for name in GATED_DELTA_RULE_FUNCTIONS:
            function: Callable | None = getattr(module, name, None)
            original = getattr(function, "__wrapped__", None)
            if original is not None:
                setattr(module, name, original)
                swapped += 1
    return swapped


def settle_linear_attention(
    model: nn.Module, backend: str | None, choice: str, device: torch.device
) -> str | None:
    """Make a loaded target run the implementation ``linear_attention_backend`` chose for
    ``choice`` (target.linear_attention) and return the one it runs, saying where that is
    not what was asked: FLA missing on a GPU, or a transformers without the torch
    implementation to switch to."""
    fla_installed = importlib.util.find_spec("fla") is not None
    if backend == "torch" and device.type == "cuda" and choice == "auto":
        log.warning(
            "flash-linear-attention is not installed: the hybrid target runs the slow torch "
            "fallback on GPU (install the 'gpu' extra)"
        )
    torch_asked = backend == "torch" and choice == "torch"
    if torch_asked and not use_torch_linear_attention(model) and fla_installed:
        log.warning(
            'target.linear_attention = "torch": this transformers version offers no '
            "torch Gated DeltaNet to switch to; the layers run what it bound (FLA)"
        )
        return "fla"
    return backend
