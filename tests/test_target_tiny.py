"""The built-in tiny target: deterministic files that load like a downloaded model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoConfig, AutoTokenizer

from ringtrain.target import read_target_config
from ringtrain.target.tiny import build_tiny_target


def test_same_seed_same_files_other_seed_other_weights(tmp_path: Path) -> None:
    first = build_tiny_target(tmp_path / "a", seed=1)
    again = build_tiny_target(tmp_path / "b", seed=1)
    other = build_tiny_target(tmp_path / "c", seed=2)
    for name in ("model.safetensors", "config.json", "tokenizer.json"):
        assert (first / name).read_bytes() == (again / name).read_bytes()
    assert (first / "model.safetensors").read_bytes() != (other / "model.safetensors").read_bytes()


@pytest.mark.parametrize(("hybrid", "model_type"), [(True, "qwen3_5_text"), (False, "qwen3")])
def test_loads_with_auto_classes(tmp_path: Path, hybrid: bool, model_type: str) -> None:
    path = build_tiny_target(tmp_path, vocab_size=300, hidden_size=32, num_layers=4, hybrid=hybrid)
    config = AutoConfig.from_pretrained(path, local_files_only=True)
    assert config.model_type == model_type
    assert (config.vocab_size, config.hidden_size, config.num_hidden_layers) == (300, 32, 4)
    if hybrid:
        assert config.layer_types == ["linear_attention"] * 3 + ["full_attention"]
    assert read_target_config(path).num_hidden_layers == 4

    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    assert len(tokenizer) == 300
    assert tokenizer.mask_token_id == 299
    assert tokenizer.convert_ids_to_tokens(tokenizer.pad_token_id) == "<|endoftext|>"
    assert tokenizer.eos_token_id == config.eos_token_id


def test_tokenizer_is_byte_level_with_chat_template(tmp_path: Path) -> None:
    path = build_tiny_target(tmp_path, hybrid=False, num_layers=4)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    text = "héllo"
    assert tokenizer(text)["input_ids"] == list(text.encode())
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    chat = tokenizer.apply_chat_template(
        messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    rendered = tokenizer.decode(chat["input_ids"])
    assert rendered == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n"
    assistant = [t for t, m in zip(chat["input_ids"], chat["assistant_masks"], strict=True) if m]
    assert tokenizer.decode(assistant) == "yo<|im_end|>"
    template = json.loads((path / "tokenizer_config.json").read_text())
    assert template["mask_token"] == "<|mask|>"


def test_a_known_structure_is_read_without_importing_the_model_code(tmp_path: Path) -> None:
    """The built-in target's ranks (drafters too) skip the structure check: importing the
    model's code takes seconds of every rank's start-up. A fresh process shows it."""
    path = build_tiny_target(tmp_path, num_layers=4)
    probe = (
        "import sys; from ringtrain.target import read_target_config; "
        f"config = read_target_config({str(path)!r}, structure=sys.argv[1] == 'check'); "
        "print(config.num_hidden_layers, 'transformers.modeling_utils' in sys.modules)"
    )
    said = {
        structure: subprocess.run(
            [sys.executable, "-c", probe, structure], capture_output=True, text=True, check=True
        ).stdout.split()
        for structure in ("check", "known")
    }
    assert said == {"check": ["4", "True"], "known": ["4", "False"]}
