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
  does not reliably trace; their gated RMSNorm (``linear_attn.norm``, about six float32
  elementwise kernels eagerly) compiles on its own where it is plain torch (not FLA's
  fused norm, which some models bind), and where FLA runs them, the scaling of their
  queries and keys before the recurrence compiles on its own too
  (ringtrain.target.linear_attention.use_normalized_qk). A mixture-of-experts block (an
  ``mlp`` with ``experts``) stays eager by default: transformers' "eager" experts loop
  over the experts a batch hit, with data-dependent shapes that break graphs and
  recompile. The residual adds of such layers stay eager too.

Mixture-of-experts layers with ``moe=True``: where the experts run by an implementation
without data-dependent shapes (`STATIC_SHAPE_EXPERTS`: transformers' "grouped_mm" sorts
the token-expert pairs and runs every expert in grouped GEMMs over fixed-size buffers),
the block compiles like a dense MLP, and with it the whole layer: routing (router GEMM,
softmax, top-k, renormalisation), the gather by expert, the grouped GEMMs, SiLU*mul,
the routing-weight products and the sum over the top-k experts run in one graph, so
Inductor fuses the glue around the GEMMs instead of running it as separate eager kernels.
Its sizes (tokens x top-k) follow the batch like every other dynamic size here. Experts
of transformers' "grouped_mm" in the plain layout run by ringtrain.target.moe_experts
instead: the same grouped GEMMs, with the sum over the top-k experts as one kernel.

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
from torch import nn

from ringtrain.target.moe_experts import (
    GROUPED_EXPERTS,
    fits_grouped_experts,
    use_grouped_experts,
)

COMPILE_SETTINGS = ("auto", "on", "off")
# Sub-modules compiled on their own in a layer that is not compiled whole.
SAFE_PARTS = ("input_layernorm", "post_attention_layernorm", "self_attn", "mlp")
# A Gated DeltaNet mixer's gated RMSNorm, compiled on its own (the mixer stays eager).
GATED_NORM = "linear_attn.norm"
# Experts implementations (transformers' ``config._experts_implementation``) whose
# tensors' shapes follow only the token count: compilable with dynamic sizes.
STATIC_SHAPE_EXPERTS = ("grouped_mm", "batched_mm", GROUPED_EXPERTS)


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


def experts_implementation(experts: nn.Module) -> str | None:
    """The experts implementation transformers 5 records in the experts' config."""
    return getattr(getattr(experts, "config", None), "_experts_implementation", None)


def has_static_shape_experts(mlp: nn.Module) -> bool:
    """Whether a mixture-of-experts block's experts run by an implementation without
    data-dependent shapes."""
    return experts_implementation(mlp.experts) in STATIC_SHAPE_EXPERTS


def takes_grouped_experts(experts: nn.Module) -> bool:
    """Whether ringtrain's grouped experts (ringtrain.target.moe_experts) take these over:
    transformers runs them by "grouped_mm", they have the plain layout, and their weights
    are bf16 on a CUDA GPU that has grouped GEMMs (compute capability 8.0 or later)."""
    weight = getattr(experts, "gate_up_proj", None)
    return (
        experts_implementation(experts) == "grouped_mm"
        and fits_grouped_experts(experts)
        and weight.is_cuda
        and weight.dtype == torch.bfloat16
        and torch.cuda.get_device_capability(weight.device) >= (8, 0)
    )


def has_plain_gated_norm(layer: nn.Module) -> bool:
    """Whether a layer's Gated DeltaNet mixer has a gated RMSNorm written in plain torch."""
    norm = getattr(getattr(layer, "linear_attn", None), "norm", None)
    return isinstance(norm, nn.Module) and not type(norm).__module__.startswith("fla.")


def compile_units(layer: nn.Module, moe: bool = False) -> list[str]:
    """Names of the sub-modules of ``layer`` to compile (``""``: the whole layer); ``moe``:
    a mixture-of-experts block with static-shape experts counts as a compilable MLP."""
    mlp = getattr(layer, "mlp", None)
    compiled_mlp = mlp is not None and (
        not is_mixture_of_experts(mlp) or (moe and has_static_shape_experts(mlp))
    )
    if hasattr(layer, "self_attn") and not hasattr(layer, "linear_attn") and compiled_mlp:
        return [""]
    parts = [name for name in SAFE_PARTS if hasattr(layer, name)]
    if has_plain_gated_norm(layer):
        parts.append(GATED_NORM)
    return parts if compiled_mlp else [name for name in parts if name != "mlp"]


def compiled_forward(forward: Callable[..., Any], backend: str | Callable) -> Callable[..., Any]:
    """``forward`` compiled with dynamic sizes, no duck sizing and constant Python floats."""
    # Imported here: torch._dynamo takes seconds to import, and a process that compiles
    # nothing (a drafter rank, the launcher, a command's --help) need not pay for it.
    import torch._dynamo.config as dynamo_config
    import torch.fx.experimental._config as fx_config

    compiled = torch.compile(forward, backend=backend, dynamic=True, fullgraph=False)

    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        with fx_config.patch(use_duck_shape=False), dynamo_config.patch(specialize_float=True):
            return compiled(*args, **kwargs)

    return run


def compile_decoder_layers(
    layers: nn.ModuleList,
    backend: str | Callable = "inductor",
    moe: bool = False,
    grouped_experts: bool = True,
) -> list[str]:
    """Replace the ``forward`` of each layer's compile units by a compiled one (``moe``:
    mixture-of-experts blocks with static-shape experts too, see `compile_units`; with
    ``grouped_experts`` those of transformers' "grouped_mm" in the plain layout then run
    by ringtrain.target.moe_experts, whose top-k combine is one kernel).

    Returns the compiled units' names relative to ``layers`` (``"3"`` a whole layer,
    ``"0.mlp"`` a part). Compilation itself happens on the first forward.
    """
    compiled = []
    for index, layer in enumerate(layers):
        experts = getattr(getattr(layer, "mlp", None), "experts", None)
        if moe and grouped_experts and experts is not None and takes_grouped_experts(experts):
            use_grouped_experts(experts)
        for name in compile_units(layer, moe):
            unit = layer.get_submodule(name)
            unit.forward = compiled_forward(unit.forward, backend)
            compiled.append(f"{index}.{name}" if name else str(index))
    return compiled
