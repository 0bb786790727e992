"""The drafter's architecture (DrafterSpec): derived from the target's config, saved as config.json.

Width, vocabulary, RMSNorm epsilon and RoPE base follow the target; head counts, head size
and MLP width default to the target's unless the [drafter] config overrides them. The
same spec round-trips through the Qwen3-style `config.json` of a checkpoint.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from ringtrain.drafter.config import DrafterConfig

# The paper's loss decay per block size (w_k = exp(-(k-1)/gamma)).
PAPER_GAMMA = {16: 7.0, 10: 5.0, 8: 4.0}
# config.json "architectures" entry of each drafter architecture (what the engines load).
HF_ARCHITECTURES = {"dflash": "DFlashDraftModel", "dflash2": "DFlash2DraftModel"}
# The dflash_config keys only DFlash2 checkpoints carry (engine defaults in DrafterConfig).
DFLASH2_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")


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
    # The drafter's model class, by its name in drafter/architectures.py.
    architecture: str = "dflash"
    # DFlash2 only: in-block convolution taps and group size, selector rank and top-k.
    conv_kernel_size: int = 2
    conv_group_size: int = 16
    selector_rank: int = 256
    selector_top_k: int = 16

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
        if self.architecture == "dflash2":
            self._validate_dflash2()
        return self

    def _validate_dflash2(self) -> None:
        if self.hidden_size % self.conv_group_size:
            raise ValueError(
                f"[drafter] conv_group_size={self.conv_group_size} must divide the hidden size "
                f"{self.hidden_size}"
            )
        if self.conv_kernel_size > self.block_size:
            raise ValueError(
                f"[drafter] conv_kernel_size={self.conv_kernel_size} exceeds "
                f"block_size={self.block_size}; the convolution never reaches past a block"
            )
        if self.selector_top_k > self.vocab_size:
            raise ValueError(
                f"[drafter] selector_top_k={self.selector_top_k} exceeds the vocabulary "
                f"({self.vocab_size} tokens)"
            )


def text_config_dict(target_config: Any) -> dict[str, Any]:
    """The language-model part of a target HF config (a dict or a PretrainedConfig)."""
    config = target_config.to_dict() if hasattr(target_config, "to_dict") else dict(target_config)
    text = config.get("text_config")
    if isinstance(text, Mapping):
        return {**{k: v for k, v in config.items() if k != "text_config"}, **text}
    return config


def rope_theta_of(config: Mapping[str, Any]) -> float:
    """RoPE base of an HF config (rope_parameters.rope_theta or rope_theta; 10000 if absent)."""
    params = config.get("rope_parameters")
    if isinstance(params, Mapping) and "rope_theta" in params:
        return float(params["rope_theta"])
    return float(config.get("rope_theta", 10000.0))


def drafter_spec_from_target(
    target_config: Any, cfg: DrafterConfig, tap_layers: list[int]
) -> DrafterSpec:
    """Build the drafter spec from the target's HF config, the [drafter] config and the taps."""
    tc = text_config_dict(target_config)
    for key in ("hidden_size", "vocab_size", "num_hidden_layers", "num_attention_heads"):
        if key not in tc:
            raise ValueError(f"target config has no '{key}': is this a decoder-only LM config?")
    heads = cfg.num_attention_heads or int(tc["num_attention_heads"])
    target_head_dim = tc.get("head_dim") or int(tc["hidden_size"]) // int(tc["num_attention_heads"])
    vocab_size = int(tc["vocab_size"])
    spec = DrafterSpec(
        hidden_size=int(tc["hidden_size"]),
        num_layers=cfg.num_layers,
        num_attention_heads=heads,
        num_key_value_heads=cfg.num_key_value_heads
        or int(tc.get("num_key_value_heads") or tc["num_attention_heads"]),
        head_dim=cfg.head_dim or int(target_head_dim),
        intermediate_size=cfg.intermediate_size or int(tc.get("intermediate_size") or 0),
        vocab_size=vocab_size,
        rms_norm_eps=float(tc.get("rms_norm_eps", 1e-6)),
        rope_theta=rope_theta_of(tc),
        max_position_embeddings=int(tc.get("max_position_embeddings", 40960)),
        block_size=cfg.block_size,
        # -1 here has no tokenizer to choose from: the trainer resolves it first
        # (trainer/plan.py's resolve_mask_token); a bare spec takes the last id.
        mask_token_id=cfg.mask_token_id if cfg.mask_token_id >= 0 else vocab_size - 1,
        tap_layers=tuple(int(t) for t in tap_layers),
        num_target_layers=int(tc["num_hidden_layers"]),
        sliding_windows=tuple(cfg.sliding_windows) or (0,) * cfg.num_layers,
        sliding_causal=cfg.sliding_attention == "causal" and any(cfg.sliding_windows),
        architecture=cfg.architecture,
        **{key: getattr(cfg, key) for key in DFLASH2_KEYS},
    )
    if spec.intermediate_size <= 0:
        raise ValueError("target config has no intermediate_size; set [drafter] intermediate_size")
    return spec.validate()


def loss_gamma(cfg: DrafterConfig) -> float:
    """The loss decay gamma: the config's value, else the paper's for the block size."""
    if cfg.gamma > 0:
        return cfg.gamma
    if cfg.block_size not in PAPER_GAMMA:
        raise ValueError(
            f"[drafter] gamma: no paper default for block_size={cfg.block_size} "
            f"(known: {sorted(PAPER_GAMMA)}); set gamma explicitly"
        )
    return PAPER_GAMMA[cfg.block_size]


def causality_keys(spec: DrafterSpec) -> dict[str, bool]:
    """The config.json keys that make every engine compute the trained causality.

    SGLang, vLLM and the DFlash reference read a top-level ``is_causal`` first (vLLM then
    ``dflash_config.causal``) and apply it to EVERY layer; without it, sliding layers are
    causal and full-attention layers bidirectional. Bidirectional training therefore
    writes ``is_causal: false``; causal sliding layers next to full-attention ones write
    nothing (the engines' per-layer default is exactly that), and causal sliding layers
    alone write ``is_causal: true``.
    """
    if not spec.sliding_causal:
        return {"is_causal": False}
    if all(spec.sliding_windows):
        return {"is_causal": True}
    return {}


def hf_config_dict(spec: DrafterSpec) -> dict[str, Any]:
    """The checkpoint's config.json: a Qwen3 config plus the DFlash fields."""
    window = max(spec.sliding_windows)
    causal = causality_keys(spec)
    return {
        "architectures": [HF_ARCHITECTURES[spec.architecture]],
        "model_type": "qwen3",
        "hidden_size": spec.hidden_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads,
        "head_dim": spec.head_dim,
        "intermediate_size": spec.intermediate_size,
        "vocab_size": spec.vocab_size,
        "rms_norm_eps": spec.rms_norm_eps,
        "rope_theta": spec.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": spec.rope_theta},
        "max_position_embeddings": spec.max_position_embeddings,
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        **causal,
        "tie_word_embeddings": False,
        "use_cache": False,
        "use_sliding_window": window > 0,
        "sliding_window": window or None,
        "max_window_layers": spec.num_layers,
        "layer_types": [
            "sliding_attention" if w else "full_attention" for w in spec.sliding_windows
        ],
        "dtype": "bfloat16",
        "block_size": spec.block_size,
        "num_target_layers": spec.num_target_layers,
        "dflash_config": {
            "block_size": spec.block_size,
            "mask_token_id": spec.mask_token_id,
            "target_layer_ids": list(spec.tap_layers),
            **({"causal": causal["is_causal"]} if causal else {}),
            **architecture_keys(spec),
        },
    }


def architecture_keys(spec: DrafterSpec) -> dict[str, int]:
    """The dflash_config keys of the spec's architecture beyond DFlash's (DFlash2: its four)."""
    if spec.architecture != "dflash2":
        return {}
    return {key: getattr(spec, key) for key in DFLASH2_KEYS}


def architecture_of(config: Mapping[str, Any]) -> dict[str, Any]:
    """The DrafterSpec fields naming a config.json's architecture (and DFlash2's keys)."""
    names = {hf: name for name, hf in HF_ARCHITECTURES.items()}
    declared = [names[a] for a in config.get("architectures") or [] if a in names]
    architecture = declared[0] if declared else "dflash"
    if architecture != "dflash2":
        return {"architecture": architecture}
    dflash = config["dflash_config"]
    missing = [key for key in DFLASH2_KEYS if key not in dflash]
    if missing:
        raise ValueError(
            f"a DFlash2DraftModel config.json needs dflash_config keys {missing}; the engines "
            "refuse a DFlash2 drafter without them"
        )
    return {"architecture": architecture, **{key: int(dflash[key]) for key in DFLASH2_KEYS}}


def layer_causality(config: Mapping[str, Any], layer_types: list[str]) -> list[bool]:
    """Per layer, whether the engines compute it causal inside a block (see causality_keys)."""
    declared = config.get("is_causal")
    if declared is None:
        declared = (config.get("dflash_config") or {}).get("causal")
    if declared is not None:
        return [bool(declared)] * len(layer_types)
    return [kind == "sliding_attention" for kind in layer_types]


def _sliding_causal(config: Mapping[str, Any], layer_types: list[str]) -> bool:
    """Whether the sliding layers are causal; refuses causal full-attention layers."""
    causal = layer_causality(config, layer_types)
    if any(c and kind != "sliding_attention" for c, kind in zip(causal, layer_types, strict=True)):
        raise ValueError(
            "the config makes full-attention layers causal (is_causal = true); ringtrain "
            "drafters attend bidirectionally inside a block in full-attention layers"
        )
    return any(causal)


def spec_from_hf_config(config: Mapping[str, Any]) -> DrafterSpec:
    """Read a DrafterSpec back from a checkpoint's config.json (as written by hf_config_dict)."""
    try:
        dflash = config["dflash_config"]
        window = int(config.get("sliding_window") or 0)
        layer_types = config.get("layer_types") or ["full_attention"] * config["num_hidden_layers"]
        return DrafterSpec(
            hidden_size=int(config["hidden_size"]),
            num_layers=int(config["num_hidden_layers"]),
            num_attention_heads=int(config["num_attention_heads"]),
            num_key_value_heads=int(config["num_key_value_heads"]),
            head_dim=int(config["head_dim"]),
            intermediate_size=int(config["intermediate_size"]),
            vocab_size=int(config["vocab_size"]),
            rms_norm_eps=float(config["rms_norm_eps"]),
            rope_theta=rope_theta_of(config),
            max_position_embeddings=int(config.get("max_position_embeddings", 40960)),
            block_size=int(dflash.get("block_size", config.get("block_size", 16))),
            mask_token_id=int(dflash["mask_token_id"]),
            tap_layers=tuple(int(t) for t in dflash["target_layer_ids"]),
            num_target_layers=int(config["num_target_layers"]),
            sliding_windows=tuple(window if t == "sliding_attention" else 0 for t in layer_types),
            sliding_causal=_sliding_causal(config, list(layer_types)),
            **architecture_of(config),
        ).validate()
    except KeyError as exc:
        raise ValueError(f"drafter config.json lacks the key {exc}; not a DFlash drafter") from None
