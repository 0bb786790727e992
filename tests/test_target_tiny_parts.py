"""The built-in tiny target's parts: its config's ids and grouped heads, its byte-level
tokenizer (every byte one token, special tokens whole, the smallest vocabulary), the scale
of its embedding and LM head, and the caller's random numbers left as they were."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoTokenizer

from ringtrain.target.linear_attention import repeats_grouped_heads
from ringtrain.target.tiny import SPECIAL_TOKENS, build_tiny_target, tiny_tokenizer

# Every byte UTF-8 text can hold: one- and two-byte characters (all continuation bytes),
# each lead byte of three- and four-byte characters.
ALL_UTF8_BYTES = (
    "".join(map(chr, range(0x800)))
    + "".join(chr(max(0x800, lead << 12)) for lead in range(16))
    + "".join(chr(max(0x10000, lead << 18)) for lead in range(5))
)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tiny")
    return build_tiny_target(root / "t", vocab_size=300, hidden_size=64, num_layers=4)


def test_the_config_s_ids_are_the_tokenizer_s(tiny_dir: Path) -> None:
    config = AutoConfig.from_pretrained(tiny_dir, local_files_only=True)
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir, local_files_only=True)
    assert config.pad_token_id == tokenizer.pad_token_id == 256
    assert config.eos_token_id == tokenizer.eos_token_id == 258
    assert tokenizer.convert_ids_to_tokens(config.eos_token_id) == "<|im_end|>"


def test_heads_are_grouped_like_qwen3_5_s(tiny_dir: Path) -> None:
    """Fewer key/value heads than query heads in attention, fewer query/key heads than
    value heads in Gated DeltaNet: the tiny target runs the grouped paths a real one does."""
    config = json.loads((tiny_dir / "config.json").read_text())
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (4, 2)
    assert (config["linear_num_value_heads"], config["linear_num_key_heads"]) == (4, 2)
    loaded = AutoConfig.from_pretrained(tiny_dir, local_files_only=True)
    assert repeats_grouped_heads(loaded, "5.17.0")


def test_every_byte_is_one_token_of_its_value() -> None:
    tokenizer = tiny_tokenizer(300)
    data = ALL_UTF8_BYTES.encode()
    assert len(set(data)) == 243  # all but 0xC0, 0xC1 and 0xF5..0xFF
    assert tokenizer(ALL_UTF8_BYTES)["input_ids"] == list(data)
    assert tokenizer.decode(list(data)) == ALL_UTF8_BYTES


def test_special_tokens_are_one_token_each_after_the_bytes() -> None:
    tokenizer = tiny_tokenizer(300)
    for index, token in enumerate([*SPECIAL_TOKENS, "<|mask|>"]):
        expected = 256 + index if token != "<|mask|>" else 299
        assert tokenizer(f"a{token}b")["input_ids"] == [ord("a"), expected, ord("b")], token


def test_the_smallest_vocabulary_holds_the_mask_token_and_one_less_is_refused() -> None:
    smallest = 256 + len(SPECIAL_TOKENS) + 1
    tokenizer = tiny_tokenizer(smallest)
    assert len(tokenizer) == smallest and tokenizer.mask_token_id == smallest - 1
    with pytest.raises(ValueError, match=rf"vocab_size must be at least {smallest}, got 261"):
        tiny_tokenizer(smallest - 1)


def test_embedding_and_lm_head_rows_have_unit_norm(tiny_dir: Path) -> None:
    """Logits of unit spread, as a trained model's: the default 0.02 std gives rows of
    norm 0.16 at this width."""
    weights = load_file(str(tiny_dir / "model.safetensors"))
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        norms = weights[name].norm(dim=1)
        assert 0.85 < norms.mean().item() < 1.15, name


def test_building_leaves_the_caller_s_random_numbers_as_they_were(tmp_path: Path) -> None:
    torch.manual_seed(5)
    expected = torch.rand(4)
    torch.manual_seed(5)
    build_tiny_target(tmp_path, vocab_size=300, hidden_size=32, num_layers=4, hybrid=False)
    assert torch.equal(torch.rand(4), expected)
