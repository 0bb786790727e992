"""Compile a target's decoder layers with torch.compile (Inductor), keeping hooks eager.

Eager Hugging Face layers spend about a millisecond per layer on memory-bound kernels
around the GEMMs and attention (RMSNorms with float32 intermediates, rotary, SiLU*mul,
residual adds); Inductor fuses them. Each compiled unit's ``forward`` is replaced by a
compiled one, so ``nn.Module.__call__`` and its forward hooks (the taps, which write
into a different buffer every step) stay eager, outside the compiled region.

What is compiled, per decoder layer:

- a dense full-attention layer (``self_attn`` and a dense ``mlp``): the whole layer,
  one graph with both norms, attention, MLP and residual adds;
- any other layer, its safe parts only: the two RMSNorms (``input_layernorm``,
  ``post_attention_layernorm``), ``self_attn`` where it has one and ``mlp`` where it is
  dense. Gated DeltaNet mixers (``linear_attn``) stay eager because on GPU they call
  flash-linear-attention's autograd functions and autotuned Triton kernels, which Dynamo
  does not reliably trace; mixture-of-experts blocks (an ``mlp`` with ``experts``) stay
  eager because their routing has data-dependent shapes that break graphs and recompile.
  The residual adds of such layers stay eager too.

Shapes: every layer is an instance of one class and shares one code object, so all
layers share one set of compiled graphs (Dynamo guards on the module's structure, not
its identity, and its weights are graph inputs). Graphs are compiled with dynamic
batch and sequence sizes, without duck sizing (a sequence length equal by chance to the
head size must not be unified with it and specialised) and with Python floats (norm
epsilons, attention scale) as constants rather than graph inputs (which would also make
Dynamo restart its first trace). A steady state so needs two graphs per code object
(one row and several rows; Dynamo specialises sizes of 1), well under Dynamo's
per-code-object recompile limit, past which it would silently run the layers eagerly.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch._dynamo.config as dynamo_config
import torch.fx.experimental._config as fx_config
from torch import nn

COMPILE_SETTINGS = ("auto", "on", "off")
# Sub-modules compiled on their own in a layer that is not compiled whole.
SAFE_PARTS = ("input_layernorm", "post_attention_layernorm", "self_attn", "mlp")


def resolve_compile(setting: str, device: torch.device) -> bool:
    """Whether to compile (``target.compile``): ``"auto"`` on CUDA only, ``"on"``, ``"off"``."""
    if setting not in COMPILE_SETTINGS:
        raise ValueError(
            f"target.compile {setting!r} is not one of {', '.join(map(repr, COMPILE_SETTINGS))}; "
            f"'auto' compiles the target's layers on CUDA and runs them eagerly on CPU"
        )
    if setting == "auto":
        return device.type == "cuda"
    return setting == "on"


def is_mixture_of_experts(mlp: nn.Module) -> bool:
    """Whether a layer's ``mlp`` is a routed mixture-of-experts block."""
    return hasattr(mlp, "experts")


def compile_units(layer: nn.Module) -> list[str]:
    """Names of the sub-modules of ``layer`` to compile (``""``: the whole layer)."""
    dense_mlp = hasattr(layer, "mlp") and not is_mixture_of_experts(layer.mlp)
    if hasattr(layer, "self_attn") and not hasattr(layer, "linear_attn") and dense_mlp:
        return [""]
    parts = [name for name in SAFE_PARTS if hasattr(layer, name)]
    return parts if dense_mlp else [name for name in parts if name != "mlp"]


def compiled_forward(forward: Callable[..., Any], backend: str | Callable) -> Callable[..., Any]:
    """``forward`` compiled with dynamic sizes, no duck sizing and constant Python floats."""
    compiled = torch.compile(forward, backend=backend, dynamic=True, fullgraph=False)

    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        with fx_config.patch(use_duck_shape=False), dynamo_config.patch(specialize_float=True):
            return compiled(*args, **kwargs)

    return run


def compile_decoder_layers(
    layers: nn.ModuleList, backend: str | Callable = "inductor"
) -> list[str]:
    """Replace the ``forward`` of each layer's compile units by a compiled one.

    Returns the compiled units' names relative to ``layers`` (``"3"`` a whole layer,
    ``"0.mlp"`` a part). Compilation itself happens on the first forward.
    """
    compiled = []
    for index, layer in enumerate(layers):
        for name in compile_units(layer):
            unit = layer.get_submodule(name)
            unit.forward = compiled_forward(unit.forward, backend)
            compiled.append(f"{index}.{name}" if name else str(index))
    return compiled
