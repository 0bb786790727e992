"""The drafter's config.json: a spec built from the target's config, written, and read back.

`drafter_spec_from_target` derives a DrafterSpec from the target's HF config, the
[drafter] config and the tapped layers; `hf_config_dict` writes it as the Qwen3-style
config.json a checkpoint carries (the architecture's `hf_name`, its settings among the
dflash_config keys: what the serving engines read), and `spec_from_hf_config` reads it
back.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import msgspec

from ringtrain.drafter.arch import ARCHITECTURES, architecture_named
from ringtrain.drafter.config import DrafterConfig
from ringtrain.drafter.spec import DrafterSpec, rope_theta_of, text_config_dict


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
        settings=architecture_named(cfg.architecture).settings_of(cfg),
    )
    if spec.intermediate_size <= 0:
        raise ValueError("target config has no intermediate_size; set [drafter] intermediate_size")
    return spec.validate()


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
        "architectures": [architecture_named(spec.architecture).hf_name],
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
            **msgspec.structs.asdict(spec.settings),
        },
    }


def architecture_fields(config: Mapping[str, Any]) -> dict[str, Any]:
    """The DrafterSpec fields naming a config.json's architecture, with its settings
    (from dflash_config; a config.json that names no known architecture is DFlash's)."""
    names = {architecture.hf_name: name for name, architecture in ARCHITECTURES.items()}
    declared = [names[a] for a in config.get("architectures") or [] if a in names]
    name = declared[0] if declared else "dflash"
    architecture = ARCHITECTURES[name]
    keys = architecture.settings.__struct_fields__
    dflash = config["dflash_config"]
    missing = [key for key in keys if key not in dflash]
    if missing:
        raise ValueError(
            f"a {architecture.hf_name} config.json needs dflash_config keys {missing}; the "
            "engines refuse such a drafter without them"
        )
    settings = msgspec.convert(
        {key: dflash[key] for key in keys}, architecture.settings, strict=False
    )
    return {"architecture": name, "settings": settings}


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
        if not isinstance(dflash, Mapping):
            raise ValueError(
                f"drafter config.json has dflash_config = {json.dumps(dflash)}, not an object "
                "of the DFlash keys; not a DFlash drafter"
            )
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
            **architecture_fields(config),
        ).validate()
    except KeyError as exc:
        raise ValueError(f"drafter config.json lacks the key {exc}; not a DFlash drafter") from None
