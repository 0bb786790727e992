"""The drafter's shape (DrafterSpec): everything needed to build it and write its config.json.

Width, vocabulary, RMSNorm epsilon and RoPE base follow the target; head counts, head size
and MLP width default to the target's unless the [drafter] config overrides them
(drafter/hf_config.py builds the spec from the target's config and writes and reads it as
a checkpoint's Qwen3-style `config.json`). An architecture's own fields are its
`ArchitectureSettings` (drafter/arch/), held in `DrafterSpec.settings`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec


class ArchitectureSettings(msgspec.Struct, frozen=True, kw_only=True):
    """An architecture's own spec fields (none here): each is also a [drafter] key of the
    same name and a key of the checkpoint's dflash_config (what the engines read)."""

    def validate(self, spec: DrafterSpec) -> None:
        """Raise ValueError naming a field that does not fit `spec`."""


class DrafterSpec(msgspec.Struct, frozen=True, kw_only=True):
    """Everything needed to build a drafter and to write its config.json."""

    hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    block_size: int
    mask_token_id: int
    tap_layers: tuple[int, ...]
    num_target_layers: int
    # Per layer: 0 = full attention, w > 0 = keys within w positions of the query.
    sliding_windows: tuple[int, ...]
    # Sliding layers causal inside a block (block token k sees block tokens 0..k).
    sliding_causal: bool = False
    # The drafter's architecture, by its name in drafter/arch/__init__.py's table.
    architecture: str = "dflash"
    # The architecture's own fields (its Architecture.settings; DFlash has none).
    settings: ArchitectureSettings = ArchitectureSettings()

    @property
    def num_taps(self) -> int:
        """Number of tapped target layers K (the context features are K * hidden wide)."""
        return len(self.tap_layers)

    def validate(self) -> DrafterSpec:
        """Raise ValueError naming the inconsistent field; return self when consistent."""
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"drafter num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}; set [drafter] head counts"
            )
        if self.block_size < 2:
            raise ValueError(f"[drafter] block_size={self.block_size} must be at least 2")
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise ValueError(
                f"[drafter] mask_token_id={self.mask_token_id} is outside the vocabulary "
                f"(size {self.vocab_size}); use the target's mask token id or -1"
            )
        if not self.tap_layers:
            raise ValueError("the drafter needs at least one tapped target layer")
        for layer in self.tap_layers:
            if not 0 <= layer < self.num_target_layers:
                raise ValueError(
                    f"tapped layer {layer} is out of range: the target has "
                    f"{self.num_target_layers} layers (valid 0..{self.num_target_layers - 1})"
                )
        if len(self.sliding_windows) != self.num_layers:
            raise ValueError(
                f"[drafter] sliding_windows has {len(self.sliding_windows)} entries; "
                f"give one per layer ({self.num_layers}) or leave it empty"
            )
        windows = {w for w in self.sliding_windows if w}
        if any(w < self.block_size for w in windows):
            raise ValueError(
                f"[drafter] sliding_windows {list(self.sliding_windows)}: a window must be 0 or "
                f"at least block_size={self.block_size}"
            )
        if len(windows) > 1:
            raise ValueError(
                f"[drafter] sliding_windows {list(self.sliding_windows)}: all sliding layers "
                "must share one window (a Qwen3 config.json holds one sliding_window)"
            )
        self.settings.validate(self)
        return self


def text_config_dict(target_config: Any) -> dict[str, Any]:
    """The language-model part of a target HF config (a dict or a PretrainedConfig)."""
    config = target_config.to_dict() if hasattr(target_config, "to_dict") else dict(target_config)
    text = config.get("text_config")
    if isinstance(text, Mapping):
        return {**{k: v for k, v in config.items() if k != "text_config"}, **text}
    return config


def rope_theta_of(config: Mapping[str, Any]) -> float:
    """RoPE base of an HF config (rope_parameters.rope_theta or rope_theta; 10000 if absent).
    A model with RoPE parameters per layer type (Gemma 3: its sliding layers' base 10000,
    its full-attention layers' 1e6) gives its full-attention layers' base: the drafter's
    layers see the whole context as those do."""
    params = config.get("rope_parameters")
    if isinstance(params, Mapping) and isinstance(params.get("full_attention"), Mapping):
        params = params["full_attention"]
    if isinstance(params, Mapping) and "rope_theta" in params:
        return float(params["rope_theta"])
    return float(config.get("rope_theta", 10000.0))
