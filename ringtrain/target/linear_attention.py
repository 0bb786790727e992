"""Which Gated DeltaNet implementation a hybrid target runs (``target.linear_attention``).

transformers runs a hybrid target's Gated DeltaNet layers either with
flash-linear-attention's Triton kernels (bound when the modeling module is imported, where
FLA is installed) or with its own torch implementation. FLA's kernels are the fast choice
for real targets but autotune at the first forward (about 40 s for the tiny built-in
target on an H200 with empty caches); a tiny target gains nothing from them, so
``"torch"`` swaps transformers' own implementation back in for one loaded model.

The short causal convolution before the recurrence is dispatched the same way, but to the
``causal_conv1d`` package, not to FLA: without that package transformers runs aten's
generic depthwise convolution on a [batch, channels, time] layout (1.8 ms per layer at
9,216 tokens of 10,240 channels on an H200), and the layer then copies its transposed
output back to [batch, time, channels] before splitting it into queries, keys and
values. Where FLA runs the recurrence and ``causal_conv1d`` is absent, FLA's Triton causal
convolution takes the [batch, time, channels] layout directly (0.16 ms there).

The convolution's output holds queries, keys and values side by side in each row; the
layer passes FLA three strided views of it, and FLA copies each into a contiguous tensor
and then scales queries and keys to unit length in two more kernels. In a compiled target
that preparation runs instead as one compiled function (`use_normalized_qk`): the scaling
reads the strided views and writes the contiguous tensors FLA takes, and FLA is told the
queries and keys are normalised already.
"""

from __future__ import annotations

import importlib.util
import logging
import re
import sys
from collections.abc import Callable
from types import ModuleType

import torch
import transformers
from torch import nn
from transformers import PretrainedConfig

from ringtrain.target.fla_configs import use_shipped_fla_configs
from ringtrain.target.model_dir import TargetLoadError
from ringtrain.target.structure import is_hybrid

log = logging.getLogger(__name__)

# The module-level functions transformers' hybrid models call for the Gated DeltaNet
# recurrence. Each is wrapped to dispatch to FLA when it was importable; the wrapper
# keeps the torch function as __wrapped__.
GATED_DELTA_RULE_FUNCTIONS = ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule")
# The module-level function transformers' hybrid models call for the short causal
# convolution of a whole sequence (one-token decoding calls causal_conv1d_update).
SHORT_CONVOLUTION_FUNCTION = "causal_conv1d_fn"
# The whole-sequence Gated DeltaNet recurrence, the one a target's forward calls.
CHUNK_RULE_FUNCTION = GATED_DELTA_RULE_FUNCTIONS[0]
# FLA's L2 normalisation: x / sqrt(sum(x^2) + eps) per head, in float32.
L2NORM_EPS = 1e-6
# The first transformers release whose hybrid models pass grouped query/key heads to FLA
# as they are (FLA's kernels expand them); earlier ones copy them per value head first.
GROUPED_HEADS_TRANSFORMERS = "5.23"


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


def choose_linear_attention(
    config: PretrainedConfig, device: torch.device, choice: str = "auto"
) -> str | None:
    """`linear_attention_backend`'s choice, made before the target is built: where it is
    FLA, FLA is pointed at the kernel configurations shipped for this GPU first
    (ringtrain.target.fla_configs), since building the model imports FLA."""
    backend = linear_attention_backend(config, device, choice)
    if backend == "fla":
        use_shipped_fla_configs(device)
    return backend


def modeling_modules(model: nn.Module) -> set[ModuleType]:
    """The Python modules that define ``model``'s layers (where transformers binds the
    functions the Gated DeltaNet layers call)."""
    return {sys.modules[type(layer).__module__] for layer in model.modules()}


def use_torch_linear_attention(model: nn.Module) -> int:
    """Make the Gated DeltaNet layers of ``model`` run transformers' torch implementation;
    returns how many dispatching functions were replaced (0: none found, so the layers
    run whatever transformers bound).

    The functions are module-level in the model's modeling module, so the swap holds for
    every model of that class in this process (a target rank loads one target)."""
    swapped = 0
    for module in modeling_modules(model):
        for name in GATED_DELTA_RULE_FUNCTIONS:
            function: Callable | None = getattr(module, name, None)
            original = getattr(function, "__wrapped__", None)
            if original is not None:
                setattr(module, name, original)
                swapped += 1
    return swapped


def fla_causal_conv1d_fn(
    hidden_states: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    **unused: object,
) -> torch.Tensor:
    """transformers' ``causal_conv1d_fn`` (input and output [batch, channels, time], weight
    [channels, width], zero history) computed by FLA's Triton causal convolution.

    The transposes are views: the layer's input is a transposed [batch, time, channels]
    projection, and it transposes the output back. Other keyword arguments are ignored, as
    transformers' torch implementation ignores them."""
    from fla.modules.causal_conv1d import causal_conv1d

    output, _ = causal_conv1d(hidden_states.transpose(1, 2), weight, bias, activation=activation)
    return output.transpose(1, 2)


def use_fla_short_convolution(model: nn.Module) -> None:
    """Make the Gated DeltaNet layers of ``model`` run `fla_causal_conv1d_fn` for their short
    convolution. Like `use_torch_linear_attention`, the switch holds for every model of
    that class in this process."""
    for module in modeling_modules(model):
        if hasattr(module, SHORT_CONVOLUTION_FUNCTION):
            setattr(module, SHORT_CONVOLUTION_FUNCTION, fla_causal_conv1d_fn)


def normalized_qkv(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Queries and keys scaled to unit length over each head's features as FLA's
    ``use_qk_l2norm_in_kernel`` scales them (float32, then the input's dtype), and the
    values: all three contiguous."""

    def unit(rows: torch.Tensor) -> torch.Tensor:
        wide = rows.float()
        scale = 1 / torch.sqrt((wide * wide).sum(-1, keepdim=True) + L2NORM_EPS)
        return (wide * scale).to(rows.dtype).contiguous()

    return unit(query), unit(key), value.contiguous()


def with_normalized_qk(chunk_rule: Callable, prepare: Callable) -> Callable:
    """``chunk_rule`` (transformers' whole-sequence Gated DeltaNet function) taking queries
    and keys that ``prepare`` normalised where the caller asks for the normalisation."""

    def run(query, key, value, *args, use_qk_l2norm_in_kernel: bool = False, **kwargs):
        if use_qk_l2norm_in_kernel:
            query, key, value = prepare(query, key, value)
        return chunk_rule(query, key, value, *args, use_qk_l2norm_in_kernel=False, **kwargs)

    run.normalizes_qk = True
    return run


def use_normalized_qk(model: nn.Module, prepare: Callable) -> int:
    """Make the Gated DeltaNet layers of ``model`` prepare their queries, keys and values
    with ``prepare`` (`normalized_qkv`, compiled by the caller) before the recurrence;
    returns how many modeling modules were switched. Process-wide like the other switches
    here; a second call leaves a switched module as it is."""
    switched = 0
    for module in modeling_modules(model):
        chunk_rule = getattr(module, CHUNK_RULE_FUNCTION, None)
        if chunk_rule is None or getattr(chunk_rule, "normalizes_qk", False):
            continue
        setattr(module, CHUNK_RULE_FUNCTION, with_normalized_qk(chunk_rule, prepare))
        switched += 1
    return switched


def repeats_grouped_heads(config: PretrainedConfig, transformers_version: str) -> bool:
    """Whether that transformers release copies a Gated DeltaNet's queries and keys for each
    value head of the target's grouped heads (more value heads than key heads) before the
    recurrence, as releases before GROUPED_HEADS_TRANSFORMERS do."""
    text = config.get_text_config()
    value_heads = getattr(text, "linear_num_value_heads", 0) or 0
    key_heads = getattr(text, "linear_num_key_heads", 0) or 0
    older = _major_minor(transformers_version) < _major_minor(GROUPED_HEADS_TRANSFORMERS)
    return older and (value_heads > key_heads)


def _major_minor(version: str) -> tuple[int, int]:
    """(5, 17) of "5.17.0" or "5.17.0.dev0"."""
    major, minor = re.match(r"(\d+)\.(\d+)", version).groups()
    return int(major), int(minor)


def settle_linear_attention(
    model: nn.Module, backend: str | None, choice: str, device: torch.device
) -> str | None:
    """Make a loaded target run the implementation ``linear_attention_backend`` chose for
    ``choice`` (target.linear_attention) and return the one it runs, saying where that is
    not what was asked: FLA missing on a GPU, or a transformers without the torch
    implementation to switch to. With FLA running the recurrence, the short convolutions
    run FLA's kernel too, unless the ``causal_conv1d`` package transformers prefers is
    installed."""
    fla_installed = importlib.util.find_spec("fla") is not None
    if backend == "fla" and importlib.util.find_spec("causal_conv1d") is None:
        use_fla_short_convolution(model)
    if backend == "fla" and repeats_grouped_heads(model.config, transformers.__version__):
        log.info(
            "transformers %s copies the Gated DeltaNet's queries and keys once per value head "
            "before FLA's kernels (about 2%% of a hybrid target's forward); transformers "
            "%s and newer hands FLA the grouped heads as they are: pip install -U "
            "'transformers>=%s'",
            transformers.__version__,
            GROUPED_HEADS_TRANSFORMERS,
            GROUPED_HEADS_TRANSFORMERS,
        )
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
