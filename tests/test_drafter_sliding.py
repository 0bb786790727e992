"""Sliding-window drafter layers as serving engines compute them from the checkpoint (CPU).

The reference reads the saved config.json through transformers' Qwen3Config and the
weights from model.safetensors, and builds every layer's mask from the engines'
published rules (the DFlash reference model, SGLang and vLLM agree on them):

- causality: ``is_causal`` if the config declares it, for every layer; else vLLM's
  ``dflash_config.causal``; else sliding layers causal, full-attention layers not;
- window (Hugging Face's ``sliding_window`` counts the current token): a query at
  position q sees keys with q - k < window, and when causal also k <= q; when not
  causal also k - q < window.

Its layers are transformers' Qwen3 RMSNorm, MLP and rotary embedding; attention is
written out with the explicit dense mask. The drafter's inference path must give the
same logits, for both trained semantics.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import Qwen3Config
from transformers.models.qwen3.modeling_qwen3 import (
    Qwen3MLP,
    Qwen3RMSNorm,
    Qwen3RotaryEmbedding,
    apply_rotary_pos_emb,
)

from ringtrain.drafter import DFlashDrafter, FrozenHead, drafter_spec_from_target
from ringtrain.drafter.config import DrafterConfig
from ringtrain.drafter.hf_config import hf_config_dict, spec_from_hf_config

TARGET = {
    "hidden_size": 32,
    "vocab_size": 50,
    "num_hidden_layers": 8,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "intermediate_size": 48,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
}
TAPS = [1, 3, 5]
BLOCK, WINDOW, CONTEXT = 4, 8, 21


def engine_causality(config: Qwen3Config, layer: int) -> bool:
    declared = getattr(config, "is_causal", None)
    if declared is None:
        declared = (getattr(config, "dflash_config", None) or {}).get("causal")
    if declared is not None:
        return bool(declared)
    return config.layer_types[layer] == "sliding_attention"


def engine_mask(config: Qwen3Config, layer: int, positions: torch.Tensor) -> torch.Tensor:
    """[B, n + B] visibility of keys [context ; block] for the block's queries."""
    query = positions[-BLOCK:, None]
    key = positions[None, :]
    visible = torch.ones(BLOCK, len(positions), dtype=torch.bool)
    causal = engine_causality(config, layer)
    if causal:
        visible &= key <= query
    if config.layer_types[layer] == "sliding_attention":
        visible &= query - key < config.sliding_window
        if not causal:
            visible &= key - query < config.sliding_window
    return visible


class ReferenceLayer(nn.Module):
    def __init__(self, config: Qwen3Config) -> None:
        super().__init__()
        self.self_attn = nn.Module()
        heads, kv_heads, dim = 4, 2, config.head_dim
        for name, rows in (("q", heads), ("k", kv_heads), ("v", kv_heads)):
            setattr(self.self_attn, f"{name}_proj", nn.Linear(32, rows * dim, bias=False))
        self.self_attn.o_proj = nn.Linear(heads * dim, 32, bias=False)
        self.self_attn.q_norm = Qwen3RMSNorm(dim, config.rms_norm_eps)
        self.self_attn.k_norm = Qwen3RMSNorm(dim, config.rms_norm_eps)
        self.mlp = Qwen3MLP(config)
        self.input_layernorm = Qwen3RMSNorm(32, config.rms_norm_eps)
        self.post_attention_layernorm = Qwen3RMSNorm(32, config.rms_norm_eps)

    def forward(self, x, ctx, cos, sin, mask):
        attn, dim = self.self_attn, 8
        h = self.input_layernorm(x)
        kv_in = torch.cat((ctx, h))
        q = attn.q_norm(attn.q_proj(h).view(BLOCK, 4, dim)).transpose(0, 1)[None]
        k = attn.k_norm(attn.k_proj(kv_in).view(-1, 2, dim)).transpose(0, 1)[None]
        v = attn.v_proj(kv_in).view(-1, 2, dim).transpose(0, 1)[None]
        q, _ = apply_rotary_pos_emb(q, q, cos[:, -BLOCK:], sin[:, -BLOCK:])
        _, k = apply_rotary_pos_emb(k, k, cos, sin)
        k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
        scores = (q @ k.transpose(-1, -2)) * dim**-0.5
        weights = scores.masked_fill(~mask, float("-inf")).softmax(-1)
        out = (weights @ v)[0].transpose(0, 1).reshape(BLOCK, -1)
        x = x + attn.o_proj(out)
        return x + self.mlp(self.post_attention_layernorm(x))


class ReferenceDrafter(nn.Module):
    def __init__(self, directory: Path) -> None:
        super().__init__()
        self.config = Qwen3Config.from_pretrained(directory)
        n = self.config.num_hidden_layers
        self.layers = nn.ModuleList(ReferenceLayer(self.config) for _ in range(n))
        self.fc = nn.Linear(len(TAPS) * 32, 32, bias=False)
        self.hidden_norm = Qwen3RMSNorm(32, self.config.rms_norm_eps)
        self.norm = Qwen3RMSNorm(32, self.config.rms_norm_eps)
        self.rotary = Qwen3RotaryEmbedding(self.config)
        self.load_state_dict(load_file(str(directory / "model.safetensors")))
        self.double()

    def forward(self, taps, embeds, positions):
        ctx = self.hidden_norm(self.fc(taps))
        x = embeds
        cos, sin = self.rotary(x, positions[None])
        for index, layer in enumerate(self.layers):
            x = layer(x, ctx, cos, sin, engine_mask(self.config, index, positions))
        return self.norm(x)


def save_drafter(directory: Path, sliding: str, windows: list[int]) -> DFlashDrafter:
    cfg = DrafterConfig(
        num_layers=len(windows), block_size=BLOCK, sliding_windows=windows,
        sliding_attention=sliding,
    )  # fmt: skip
    spec = drafter_spec_from_target(TARGET, cfg, TAPS)
    torch.manual_seed(0)
    model = DFlashDrafter(spec)
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(hf_config_dict(spec)))
    save_file(model.state_dict(), directory / "model.safetensors")
    return model.double()


@pytest.mark.parametrize("sliding", ["bidirectional", "causal"])
@pytest.mark.parametrize("windows", [[WINDOW, WINDOW, 0], [WINDOW, WINDOW]], ids=["mixed", "all"])
def test_sliding_checkpoint_equals_the_engine_semantics(
    tmp_path: Path, sliding: str, windows: list[int]
) -> None:
    model = save_drafter(tmp_path / "drafter", sliding, windows)
    reference = ReferenceDrafter(tmp_path / "drafter")
    gen = torch.Generator().manual_seed(1)
    taps = torch.randn(CONTEXT, len(TAPS) * 32, generator=gen, dtype=torch.float64)
    embed, lm_head = torch.randn(2, 50, 32, generator=gen, dtype=torch.float64)
    block_ids = torch.tensor([3] + [49] * (BLOCK - 1))
    positions = torch.arange(CONTEXT + BLOCK)
    ours = model.draft_logits(
        FrozenHead(embed, lm_head), taps, positions[:CONTEXT], block_ids, positions[CONTEXT:]
    )
    with torch.no_grad():
        theirs = reference(taps, embed[block_ids], positions) @ lm_head.t()
    # transformers' Qwen3RMSNorm computes in float32 even for float64 inputs.
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


def test_config_keys_say_which_semantics_was_trained(tmp_path: Path) -> None:
    keys = {}
    for sliding in ("bidirectional", "causal"):
        for name, windows in (("mixed", [WINDOW, 0]), ("all", [WINDOW, WINDOW])):
            save_drafter(tmp_path / f"{sliding}-{name}", sliding, windows)
            raw = json.loads((tmp_path / f"{sliding}-{name}" / "config.json").read_text())
            keys[sliding, name] = (raw.get("is_causal"), raw["dflash_config"].get("causal"))
            assert spec_from_hf_config(raw).sliding_causal == (sliding == "causal")
    assert keys["bidirectional", "mixed"] == keys["bidirectional", "all"] == (False, False)
    assert keys["causal", "mixed"] == (None, None), "engines' per-layer default"
    assert keys["causal", "all"] == (True, True)
    with pytest.raises(ValueError, match="full-attention layers causal"):
        spec_from_hf_config(
            {**raw, "is_causal": True, "layer_types": ["sliding_attention", "full_attention"]}
        )


def test_causal_and_bidirectional_sliding_layers_differ(tmp_path: Path) -> None:
    """The window must cut the context and causality the block, or the tests above prove little."""
    gen = torch.Generator().manual_seed(2)
    taps = torch.randn(CONTEXT, len(TAPS) * 32, generator=gen, dtype=torch.float64)
    head = FrozenHead(*torch.randn(2, 50, 32, generator=gen, dtype=torch.float64))
    block_ids = torch.tensor([3] + [49] * (BLOCK - 1))
    positions = torch.arange(CONTEXT + BLOCK)
    logits = {}
    for sliding, windows in (
        ("bidirectional", [0, 0]),
        ("bidirectional", [8, 8]),
        ("causal", [8, 8]),
    ):
        model = save_drafter(tmp_path / f"{sliding}-{windows[0]}", sliding, windows)
        logits[sliding, windows[0]] = model.draft_logits(
            head, taps, positions[:CONTEXT], block_ids, positions[CONTEXT:]
        )
    full, windowed, causal = logits.values()
    assert (full - windowed).abs().max() > 1e-2
    assert (windowed - causal).abs().max() > 1e-2
