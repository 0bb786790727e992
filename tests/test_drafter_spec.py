"""The drafter's shape taken from the target's config and what it may hold.

The spec (drafter/spec.py): the RoPE base read as transformers reads the same config.json
(top-level rope_theta, rope_parameters, a multimodal text_config, neither: 10000; per
layer type, Gemma 3's: its full-attention layers'), and the
shapes it refuses by name, from the [drafter] config or from a checkpoint's config.json
(head counts that do not group, a block of one token, a mask token or a tapped layer
outside its range, sliding windows that do not fit the layers or the block). The limits
(drafter/limits.py): the memory a drafter needs to train (16 bytes a parameter) against the
host's, and the largest learning rate and selector loss weight that stay finite in float32.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import pytest
import torch
from transformers import Gemma3TextConfig, LlamaConfig, Qwen3_5Config, Qwen3Config

from ringtrain.checkpoint.verify import checkpoint_spec
from ringtrain.drafter import drafter_spec_from_target
from ringtrain.drafter.arch import build_drafter
from ringtrain.drafter.blocks import layout_sizes
from ringtrain.drafter.config import PAPER_DRAFTER, DrafterConfig
from ringtrain.drafter.hf_config import hf_config_dict
from ringtrain.drafter.limits import check_limits, device_memory
from tests.helpers.tiny_drafter import MAX_TOKENS, make_cfg, paper_optim
from tests.helpers.tiny_drafter import TAPS as TINY_TAPS
from tests.helpers.tiny_drafter import TARGET as TINY_TARGET

CPU = torch.device("cpu")
FLOAT32_MAX = torch.finfo(torch.float32).max
TARGET = Qwen3Config(
    vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=6,
    num_attention_heads=4, num_key_value_heads=2, head_dim=4, rms_norm_eps=1e-5,
)  # fmt: skip
TAPS = [1, 4]
# A Llama config.json as the hub holds it: no rope_theta at all (transformers: 10000).
LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
    "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 4,
    "vocab_size": 100, "intermediate_size": 128, "rms_norm_eps": 1e-5,
}  # fmt: skip


def drafter(**overrides) -> DrafterConfig:
    """The paper's drafter of two layers and blocks of 4, with `overrides`."""
    return DrafterConfig(**{**PAPER_DRAFTER, "num_layers": 2, "block_size": 4, **overrides})


def _qwen3_5(rope_theta: float) -> dict:
    """A Qwen3.5 config.json: the language model's fields, RoPE included, in text_config."""
    text = {
        "model_type": "qwen3_5_text", "hidden_size": 64, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 4, "vocab_size": 100,
        "intermediate_size": 128, "rms_norm_eps": 1e-6,
        "rope_parameters": {
            "rope_type": "default", "rope_theta": rope_theta, "partial_rotary_factor": 0.25,
        },
    }  # fmt: skip
    architectures = ["Qwen3_5ForConditionalGeneration"]
    return {"architectures": architectures, "model_type": "qwen3_5", "text_config": text}


@pytest.mark.parametrize(
    ("raw", "config_class"),
    [
        (LLAMA, LlamaConfig),
        ({**LLAMA, "model_type": "qwen3", "rope_theta": 1_000_000, "rope_scaling": None},
         Qwen3Config),
        ({**LLAMA, "model_type": "qwen3",
          "rope_parameters": {"rope_type": "default", "rope_theta": 5e5}}, Qwen3Config),
        (_qwen3_5(1e7), Qwen3_5Config),
    ],
    ids=["llama-without-rope-theta", "qwen3-rope-theta", "rope-parameters", "qwen3.5-text-config"],
)  # fmt: skip
def test_the_rope_base_is_the_one_transformers_reads(raw: dict, config_class: type) -> None:
    read = config_class.from_dict(raw)
    expected = getattr(read, "text_config", read).rope_parameters["rope_theta"]
    from_dict = drafter_spec_from_target(raw, drafter(), [1, 2])
    from_config = drafter_spec_from_target(read, drafter(), [1, 2])
    assert from_dict.rope_theta == from_config.rope_theta == float(expected)
    assert hf_config_dict(from_config)["rope_parameters"]["rope_theta"] == float(expected)


def test_a_target_with_a_rope_base_per_layer_type_gives_its_full_attention_base() -> None:
    gemma = Gemma3TextConfig(
        vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    )  # fmt: skip
    bases = {kind: p["rope_theta"] for kind, p in gemma.rope_parameters.items()}
    assert bases == {"sliding_attention": 10_000.0, "full_attention": 1_000_000.0}
    for target in (gemma, gemma.to_dict()):
        assert drafter_spec_from_target(target, drafter(), [1, 4]).rope_theta == 1_000_000.0


def test_head_counts_that_do_not_group_are_refused_by_name() -> None:
    grouped = drafter_spec_from_target(TARGET, drafter(num_attention_heads=6), TAPS)
    assert (grouped.num_attention_heads, grouped.num_key_value_heads) == (6, 2)
    with pytest.raises(
        ValueError,
        match=r"num_attention_heads=3 is not a multiple of num_key_value_heads=2; set \[drafter\]",
    ):
        drafter_spec_from_target(TARGET, drafter(num_attention_heads=3), TAPS)


def test_a_negative_tapped_layer_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"tapped layer -1 is out of range.*valid 0\.\.5"):
        drafter_spec_from_target(TARGET, drafter(), [-1, 4])


def test_sliding_windows_must_fit_the_layers_and_the_block() -> None:
    exact = drafter_spec_from_target(TARGET, drafter(sliding_windows=[0, 4]), TAPS)
    assert exact.sliding_windows == (0, 4)
    with pytest.raises(ValueError, match="a window must be 0 or at least block_size=4"):
        drafter_spec_from_target(TARGET, drafter(sliding_windows=[0, 3]), TAPS)
    with pytest.raises(ValueError, match=r"has 3 entries; give one per layer \(2\)"):
        drafter_spec_from_target(TARGET, drafter(sliding_windows=[0, 8, 8]), TAPS)
    with pytest.raises(ValueError, match="all sliding layers must share one window"):
        drafter_spec_from_target(TARGET, drafter(sliding_windows=[8, 16]), TAPS)


@pytest.mark.parametrize(
    ("key", "value", "named"),
    [
        ("block_size", 1, "block_size=1 must be at least 2"),
        ("mask_token_id", -1, r"mask_token_id=-1 is outside the vocabulary \(size 40\)"),
        ("target_layer_ids", [-1, 4], "tapped layer -1 is out of range"),
    ],
)
def test_a_checkpoint_config_json_the_drafter_cannot_be_is_refused(
    tmp_path: Path, key: str, value: object, named: str
) -> None:
    """A config.json another writer made (a block of one token, -1 for an unset mask
    token, a negative layer id) names its problem and the file."""
    raw = hf_config_dict(drafter_spec_from_target(TARGET, drafter(), TAPS))
    raw["dflash_config"][key] = value
    tmp_path.joinpath("config.json").write_text(json.dumps(raw))
    with pytest.raises(ValueError, match=named) as refused:
        checkpoint_spec(tmp_path)
    assert str(tmp_path / "config.json") in str(refused.value)


def test_the_host_memory_is_its_total_ram() -> None:
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert device_memory(CPU) == (total, "this host's memory")


def _parameters(cfg: DrafterConfig) -> dict[str, torch.Size]:
    with torch.device("meta"):
        model = build_drafter(drafter_spec_from_target(TINY_TARGET, cfg, TINY_TAPS))
    return {name: p.shape for name, p in model.named_parameters()}


def _sized(parameters: int) -> tuple[DrafterConfig, dict[str, torch.Size]]:
    """The tiny drafter with the MLP width that gives it about `parameters` parameters."""
    small, large = (_parameters(make_cfg(intermediate_size=w)) for w in (64, 128))
    base = sum(s.numel() for s in small.values())
    per_width = (sum(s.numel() for s in large.values()) - base) // 64
    cfg = make_cfg(intermediate_size=64 + (parameters - base) // per_width)
    return cfg, _parameters(cfg)


def test_a_drafter_is_refused_when_its_training_state_outgrows_the_host() -> None:
    """Weights, gradients and two AdamW moments in fp32: 16 bytes a parameter. A drafter
    with a parameter for every 10 bytes of the host's memory needs 1.6 times that memory;
    one with a parameter for every 20 bytes fits."""
    memory, _ = device_memory(CPU)
    fits, _ = _sized(memory // 20)
    fitting = drafter_spec_from_target(TINY_TARGET, fits, TINY_TAPS)
    check_limits(fits, paper_optim(), fitting, MAX_TOKENS, CPU)
    cfg, shapes = _sized(memory // 10)
    count = sum(s.numel() for s in shapes.values())
    spec = drafter_spec_from_target(TINY_TARGET, cfg, TINY_TAPS)
    with pytest.raises(ValueError) as refused:
        check_limits(cfg, paper_optim(), spec, MAX_TOKENS, CPU)
    text = str(refused.value)
    assert f"a drafter of {count:,} parameters, {count * 16 / 2**30:,.1f} GiB to train" in text
    assert f"(16 bytes each), more than the {memory / 2**30:,.1f} GiB of this host's memory" in text
    largest = re.search(r"its largest tensor is (\S+) \[(\d+), (\d+)\]", text)
    assert largest, text
    name, rows, cols = largest.group(1), int(largest.group(2)), int(largest.group(3))
    assert shapes[name] == (rows, cols) and rows * cols == max(s.numel() for s in shapes.values())
    assert cfg.intermediate_size in (rows, cols)


def test_muons_largest_learning_rate_follows_its_widest_matrix() -> None:
    """torch's Muon scales a step by 0.2 x sqrt(max(rows, cols)) of its widest matrix: fc,
    which takes the 3 tapped layers' features (3 x 32 = 96 columns)."""
    cfg = make_cfg()
    spec = drafter_spec_from_target(TINY_TARGET, cfg, TINY_TAPS)
    largest = FLOAT32_MAX / (0.2 * math.sqrt(96))
    check_limits(cfg, paper_optim(name="muon", lr=largest * 0.99), spec, MAX_TOKENS, CPU)
    with pytest.raises(ValueError) as refused:
        check_limits(cfg, paper_optim(name="muon", lr=largest * 1.01), spec, MAX_TOKENS, CPU)
    text = str(refused.value)
    assert "(Muon's scale for its widest matrix, 96)" in text, text
    assert f"so lr <= {largest:.3g}" in text, text
    check_limits(cfg, paper_optim(name="adamw", lr=largest * 1.01), spec, MAX_TOKENS, CPU)


def test_the_selector_weight_bound_counts_each_blocks_predicted_positions() -> None:
    """DFlash2's selector loss is summed over every anchor's block_size - 1 predicted
    positions (the anchor itself is given, not scored)."""
    cfg = make_cfg(architecture="dflash2")
    _, anchors = layout_sizes(cfg, MAX_TOKENS)
    slots = anchors * (cfg.block_size - 1)
    largest = FLOAT32_MAX / (slots * math.log(cfg.selector_top_k))
    spec = drafter_spec_from_target(TINY_TARGET, cfg, TINY_TAPS)
    under = make_cfg(architecture="dflash2", selector_loss_weight=largest * 0.99)
    check_limits(under, paper_optim(), spec, MAX_TOKENS, CPU)
    over = make_cfg(architecture="dflash2", selector_loss_weight=largest * 1.01)
    with pytest.raises(ValueError, match=rf"\({slots} scored slots at a cross-entropy"):
        check_limits(over, paper_optim(), spec, MAX_TOKENS, CPU)
