"""Loading a local causal LM for generation, and the facts about it that generation needs.

Evaluation (the verifying target), regeneration and synthesis all load the full causal
LM (with its LM head) from a local Hugging Face directory the same way, stop at the
same end-of-sequence ids and decide the same way whether its KV cache can be cut back.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from ringtrain.target.loader import resolve_dtype
from ringtrain.target.model_dir import WITHOUT_HUB_KERNELS


def supports_cache_rollback(config: object) -> bool:
    """Whether a KV cache of this target can be cut back exactly (all full attention)."""
    # Without layer_types, transformers makes every layer of a config with a sliding window
    # a sliding-window layer (Mistral).
    sliding = getattr(config, "sliding_window", None) is not None
    layer_types = getattr(config, "layer_types", None) or [
        "sliding_attention" if sliding else "full_attention"
    ]
    return set(layer_types) == {"full_attention"} and not getattr(
        config, "use_sliding_window", False
    )


def stop_token_ids(config: object) -> list[int]:
    """The end-of-sequence ids of an HF config (``eos_token_id``: an int, a list or None)."""
    eos = getattr(config, "eos_token_id", None)
    if eos is None:
        return []
    return [int(eos)] if isinstance(eos, int) else [int(t) for t in eos]


class IncompleteModelError(ValueError):
    """A local model directory whose weight files lack some of the model's weights."""


def load_causal_lm(
    path: str | Path, device: torch.device | str = "cpu", dtype: str = "auto"
) -> PreTrainedModel:
    """The full causal LM of a local HF directory (never the hub), frozen, in eval mode."""
    path = Path(path).expanduser()
    if not (path / "config.json").is_file():
        raise FileNotFoundError(
            f"{path}: no config.json; the target must be a local Hugging Face model directory"
        )
    device = torch.device(device)
    model, loading = AutoModelForCausalLM.from_pretrained(
        path,
        dtype=resolve_dtype(dtype, device, setting="dtype"),
        local_files_only=True,
        output_loading_info=True,
        **WITHOUT_HUB_KERNELS,
    )
    if loading["missing_keys"]:  # transformers filled them with random values
        missing = sorted(loading["missing_keys"])
        raise IncompleteModelError(
            f"{path}: the weight files lack {len(missing)} of the model's weights "
            f"({', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}); the directory is "
            "incomplete or its weights belong to another model"
        )
    return model.to(device).eval().requires_grad_(False)
