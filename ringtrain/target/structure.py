"""What the trainer needs of a target model, checked before any weight is read.

``read_target_config`` is every rank's pre-flight check of a target directory: config,
weight index, the model's structure and its quantization scheme.

ringtrain runs any decoder model that transformers can build, as long as its base
(headless) model has what the trainer uses: a ``layers`` stack of decoder layers whose
outputs a forward hook can take, a token embedding (``embed_tokens``; the drafter shares
it) and a final ``norm`` (applied for a tap of the last layer, see ``ringtrain.target.taps``).
The check builds a one-layer copy on the meta device (no memory, no weights), so it is
cheap enough for every rank's pre-flight.

It also picks the attention implementation: ``"auto"`` is SDPA where the model class
allows it, else flex_attention on CUDA and eager attention on CPU (e.g. gpt-oss, whose
attention sinks SDPA cannot express).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from transformers import PretrainedConfig
from transformers.models.auto.modeling_auto import MODEL_MAPPING

from ringtrain.target.model_dir import TargetLoadError, TargetModelDir, truncated_config_values
from ringtrain.target.quantized import dequantizing_config


def base_model_class(config: PretrainedConfig) -> type[nn.Module]:
    """The transformers base-model class (no LM head) of a text config."""
    try:
        return MODEL_MAPPING[type(config)]
    except KeyError:
        raise TargetLoadError(
            f"model type {config.model_type!r}: transformers has no base model class for it, "
            f"so ringtrain cannot run it as a target (a decoder stack with an embedding is "
            f"needed)"
        ) from None


def is_hybrid(config: PretrainedConfig) -> bool:
    """Whether the target has linear-attention (Gated DeltaNet) layers."""
    return "linear_attention" in (getattr(config, "layer_types", None) or ())


def resolve_attn_implementation(
    setting: str, config: PretrainedConfig, device: torch.device
) -> str:
    """The attention implementation to build the target with (``target.attn_implementation``)."""
    model_class = base_model_class(config)
    if setting == "auto":
        if getattr(model_class, "_supports_sdpa", False):
            return "sdpa"
        return "flex_attention" if device.type == "cuda" else "eager"
    supported = {
        "sdpa": getattr(model_class, "_supports_sdpa", False),
        "flex_attention": getattr(model_class, "_supports_flex_attn", False),
        "eager": True,
    }
    if setting not in supported:
        raise TargetLoadError(
            f"target.attn_implementation {setting!r} is not one of 'auto', 'sdpa', 'eager', "
            f"'flex_attention'"
        )
    if not supported[setting]:
        raise TargetLoadError(
            f"target.attn_implementation = {setting!r}: {model_class.__name__} does not support "
            f"it; use 'auto' (picks one the model allows) or 'eager'"
        )
    return setting


def check_structure(config: PretrainedConfig) -> None:
    """Raise TargetLoadError unless the model has the parts the trainer hooks and shares.

    Builds a one-layer model of ``config`` on the meta device, so it costs no memory and
    reads no weights.
    """
    model_class = base_model_class(config)
    values = {**config.to_dict(), "num_hidden_layers": config.num_hidden_layers}
    one_layer = type(config).from_dict(truncated_config_values(values, 1))
    with torch.device("meta"):
        module = model_class(one_layer)
    missing = [
        f"'{name}' ({what})"
        for name, what, kind in (
            ("layers", "the stack of decoder layers whose outputs are tapped", nn.ModuleList),
            ("embed_tokens", "the token embedding the drafter shares", nn.Module),
            ("norm", "the final norm, applied to a tap of the last layer", nn.Module),
        )
        if not isinstance(getattr(module, name, None), kind)
    ]
    if missing:
        raise TargetLoadError(
            f"model type {config.model_type!r} ({model_class.__name__}) cannot be a target: "
            f"it lacks {', '.join(missing)}; ringtrain taps decoder-only language models "
            f"built that way"
        )


def read_target_config(
    path: str | Path, weights: bool = True, structure: bool = True
) -> PretrainedConfig:
    """The FULL HF text config of a target directory, after checking config, weights,
    structure and quantization (``weights=False``: config only, for random weights;
    ``structure=False``: the structure is known, e.g. the built-in target's, or checked
    elsewhere, so the model's code is not imported).

    Cheap (reads config.json and the weight index or safetensors headers, builds one
    layer on the meta device), so every rank can validate its inputs with it before any
    GPU work. Importing the model's code is what costs: seconds on a busy CPU.
    """
    checkpoint = TargetModelDir(path, weights)
    config = checkpoint.text_config()
    if structure:
        check_structure(config)
    dequantizing_config(checkpoint.quantization, str(checkpoint.path))
    return config
