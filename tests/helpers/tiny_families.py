"""Tiny random models of the target families users bring, written as the hub lays them out,
and a recorder of the weights the target loader hands to transformers.

Each is a real transformers model class, built from a small config, written with
``save_pretrained`` (MoE experts one tensor per expert, as published checkpoints store
them) or, with ``fused=True``, as the model's own state dict (fused expert stacks).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file
from transformers import CONFIG_MAPPING, AutoModelForCausalLM, AutoModelForImageTextToText

from ringtrain.target.model_dir import TargetModelDir

VOCAB = 320
LAYERS = 6
COMMON = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": LAYERS,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 512,
    "tie_word_embeddings": False,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
MOE = {"num_experts_per_tok": 2, "moe_intermediate_size": 32}
HYBRID = {
    "layer_types": ["linear_attention", "linear_attention", "full_attention"] * 2,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
}
QWEN_MOE = {**MOE, "num_experts": 4, "shared_expert_intermediate_size": 32}
GROUPED_MOE = {
    **MOE,
    "n_routed_experts": 4,
    "n_shared_experts": 1,
    "n_group": 1,
    "topk_group": 1,
    "first_k_dense_replace": 1,
}
# model type -> text config values beyond COMMON
TEXT_FAMILIES: dict[str, dict] = {
    "qwen3": {},
    "llama": {},
    "qwen2": {},
    "qwen3_moe": {**QWEN_MOE, "decoder_sparse_step": 1, "mlp_only_layers": [0]},
    "qwen3_next": {**QWEN_MOE, **HYBRID, "decoder_sparse_step": 1},
    "gpt_oss": {
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "sliding_window": 8,
        "layer_types": ["sliding_attention", "full_attention"] * 3,
    },
    "glm4_moe": {**GROUPED_MOE, "use_qk_norm": True},
    "deepseek_v3": {
        **GROUPED_MOE,
        "kv_lora_rank": 16,
        "q_lora_rank": 32,
        "qk_rope_head_dim": 8,
        "qk_nope_head_dim": 16,
        "v_head_dim": 16,
        "head_dim": 8,  # the rotary part of a head (qk_rope_head_dim)
        "num_key_value_heads": 4,  # MLA: as many as query heads
    },
    "minimax_m2": {"num_local_experts": 4, "num_experts_per_tok": 2},
}
# VLM wrapper model type -> its text model's values beyond COMMON
WRAPPED_FAMILIES: dict[str, dict] = {
    "qwen3_5": {**HYBRID},
    "qwen3_5_moe": {**QWEN_MOE, **HYBRID},
}
MOE_FAMILIES = ("qwen3_moe", "qwen3_next", "gpt_oss", "glm4_moe", "deepseek_v3", "minimax_m2")
ALL_FAMILIES = (*TEXT_FAMILIES, *WRAPPED_FAMILIES)
VISION = {
    "depth": 1,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_heads": 2,
    "out_hidden_size": 64,
    "patch_size": 4,
    "temporal_patch_size": 1,
    "spatial_merge_size": 1,
    "num_position_embeddings": 16,
}


def build_model(family: str, seed: int = 0) -> torch.nn.Module:
    """A random float32 model of ``family`` (the full causal LM or VLM wrapper)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if family in WRAPPED_FAMILIES:
            text = {**COMMON, **WRAPPED_FAMILIES[family]}
            config = CONFIG_MAPPING[family](text_config=text, vision_config=VISION)
            model = AutoModelForImageTextToText.from_config(config, dtype=torch.float32)
        else:
            config = CONFIG_MAPPING[family](**{**COMMON, **TEXT_FAMILIES[family]})
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        # Larger than the default init so every layer visibly changes the hidden states
        # and routing differs between tokens.
        with torch.no_grad():
            for name, param in model.named_parameters():
                if param.ndim > 1 and "visual" not in name:
                    param.normal_(0.0, 0.1)
    return model.eval()


def write_model(directory: Path, model: torch.nn.Module, fused: bool = False) -> Path:
    """Write ``model`` to ``directory`` in the hub's on-disk layout (``fused=True``:
    experts as the model's fused stacks) and return the directory."""
    directory.mkdir(parents=True, exist_ok=True)
    if fused:
        model.config.save_pretrained(directory)
        state = {key: value.contiguous() for key, value in model.state_dict().items()}
        save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    else:
        model.save_pretrained(directory)
    return directory


def record_handed_keys(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Patch the checkpoint so that every key handed to transformers is recorded."""
    handed: list[str] = []
    original = TargetModelDir.text_weights

    def recording(self, keep):
        views = original(self, keep)
        weights = views.__enter__()
        handed.extend(weights)

        class Recorded:
            def __enter__(self):
                return weights

            def __exit__(self, *exc):
                return views.__exit__(*exc)

        return Recorded()

    monkeypatch.setattr(TargetModelDir, "text_weights", recording)
    return handed


FP8_MAX = 448.0  # largest finite float8_e4m3fn value
FP8_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def write_fp8(directory: Path, model: torch.nn.Module, block: int = 16) -> torch.nn.Module:
    """Write ``model`` as a block-wise FP8 checkpoint (float8 weights of its decoder
    layers' linear maps, one ``weight_scale_inv`` per ``block`` x ``block`` tile, the
    layout of the official -FP8 releases) and return the model holding the values that
    checkpoint means (each weight dequantized), the reference a loader must reproduce."""
    directory.mkdir(parents=True, exist_ok=True)
    state = {key: value.contiguous() for key, value in model.state_dict().items()}
    meant = {}
    for key in [k for k in state if k.endswith(".weight") and k.split(".")[-2] in FP8_LINEARS]:
        weight = state[key]
        rows, cols = weight.shape
        tiles = weight.reshape(rows // block, block, cols // block, block)
        scale = tiles.abs().amax(dim=(1, 3)).clamp(min=1e-12) / FP8_MAX
        quantized = (tiles / scale[:, None, :, None]).to(torch.float8_e4m3fn)
        meant[key] = (quantized.float() * scale[:, None, :, None]).reshape(rows, cols)
        state[key] = quantized.reshape(rows, cols)
        state[key.removesuffix("weight") + "weight_scale_inv"] = scale.contiguous()
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    model.config.quantization_config = {
        "quant_method": "fp8",
        "activation_scheme": "dynamic",
        "weight_block_size": [block, block],
    }
    model.config.save_pretrained(directory)
    del model.config.quantization_config
    with torch.no_grad():
        for key, value in meant.items():
            model.get_parameter(key).copy_(value)
    return model


def write_mxfp4(directory: Path, model: torch.nn.Module, seed: int = 0) -> Path:
    """Write a gpt-oss ``model`` as an MXFP4 checkpoint, the layout gpt-oss is published in:
    each expert stack as packed 4-bit values (``*_blocks``, two per byte, 32 per block)
    and one shared power-of-two exponent per block (``*_scales``), drawn at random."""
    config = model.config
    experts, inner, hidden = config.num_local_experts, config.intermediate_size, config.hidden_size
    generator = torch.Generator().manual_seed(seed)
    stacks = ("experts.gate_up_proj", "experts.down_proj")
    state = {k: v.contiguous() for k, v in model.state_dict().items() if not k.endswith(stacks)}
    shapes = {"gate_up_proj": (2 * inner, hidden), "down_proj": (hidden, inner)}
    for layer in range(config.num_hidden_layers):
        for name, (rows, columns) in shapes.items():
            key = f"model.layers.{layer}.mlp.experts.{name}"
            blocks = (experts, rows, columns // 32)
            state[f"{key}_blocks"] = torch.randint(
                0, 256, (*blocks, 16), dtype=torch.uint8, generator=generator
            )
            state[f"{key}_scales"] = torch.randint(
                119, 124, blocks, dtype=torch.uint8, generator=generator
            )
    directory.mkdir(parents=True, exist_ok=True)
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    config.quantization_config = {
        "quant_method": "mxfp4",
        "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router"],
    }
    config.save_pretrained(directory)
    del config.quantization_config
    return directory


# Two sequences of unequal lengths, right-padded into one batch by Padded.
SEQUENCE_LENGTHS = (13, 7)


class Padded:
    """Two sequences right-padded into one batch, as the data pipeline hands them over."""

    def __init__(self, sequences: list[np.ndarray]) -> None:
        width = max(len(s) for s in sequences) + 3
        self.input_ids = np.zeros((len(sequences), width), dtype=np.int64)
        self.attention_mask = np.zeros((len(sequences), width), dtype=np.int64)
        for row, sequence in enumerate(sequences):
            self.input_ids[row, : len(sequence)] = sequence
            self.attention_mask[row, : len(sequence)] = 1
