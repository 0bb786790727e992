"""The drafter's frozen embedding and LM head: read by key from each checkpoint layout a
target comes in, tied where the target ties them, checked for shape, and drawn at random
for runs without target files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from transformers import Qwen3Config, Qwen3ForCausalLM

from ringtrain.drafter.head import FrozenHead, load_frozen_head

VOCAB, HIDDEN = 40, 16
TEXT = {"model_type": "qwen3", "vocab_size": VOCAB, "hidden_size": HIDDEN}


def weights() -> tuple[torch.Tensor, torch.Tensor]:
    """An embedding and an LM head, different from each other."""
    embed, lm_head = torch.randn(2, VOCAB, HIDDEN, generator=torch.Generator().manual_seed(0))
    return embed, lm_head


def write_target(path: Path, tensors: dict[str, torch.Tensor], config: dict) -> Path:
    """A target directory of one safetensors file and its config.json."""
    path.mkdir()
    save_file(tensors, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.mark.parametrize(
    ("embed_key", "head_key"),
    [
        ("model.embed_tokens.weight", "lm_head.weight"),  # a plain decoder model
        ("model.language_model.embed_tokens.weight", "lm_head.weight"),  # Qwen3-VL, Gemma 3
        ("language_model.model.embed_tokens.weight", "language_model.lm_head.weight"),  # LLaVA
        ("embed_tokens.weight", "model.lm_head.weight"),  # bare language model, nested head
    ],
)
def test_each_layout_s_embedding_and_lm_head_are_read_by_key(
    tmp_path: Path, embed_key: str, head_key: str
) -> None:
    embed, lm_head = weights()
    target = write_target(tmp_path / "t", {embed_key: embed, head_key: lm_head}, TEXT)
    head = load_frozen_head(target, "cpu", torch.float32)
    assert torch.equal(head.embed, embed) and torch.equal(head.lm_head, lm_head)
    assert (head.vocab_size, head.hidden_size) == (VOCAB, HIDDEN)


def test_a_wrapper_s_own_tie_governs_its_lm_head_whatever_its_text_config_says(
    tmp_path: Path,
) -> None:
    """The LM head belongs to the wrapper, so its tie_word_embeddings applies; a text config
    written out with its defaults says False."""
    embed, lm_head = weights()
    tensors = {"model.language_model.embed_tokens.weight": embed, "lm_head.weight": lm_head}
    text = {**TEXT, "tie_word_embeddings": False}
    tied = write_target(
        tmp_path / "tied", tensors, {"tie_word_embeddings": True, "text_config": text}
    )
    head = load_frozen_head(tied, "cpu", torch.float32)
    assert head.lm_head is head.embed and torch.equal(head.embed, embed)
    untied = write_target(tmp_path / "untied", tensors, {"text_config": text})
    assert torch.equal(load_frozen_head(untied, "cpu", torch.float32).lm_head, lm_head)


def test_a_tie_stated_in_the_text_config_alone_ties_the_head(tmp_path: Path) -> None:
    embed, lm_head = weights()
    tensors = {"model.language_model.embed_tokens.weight": embed, "lm_head.weight": lm_head}
    config = {"text_config": {**TEXT, "tie_word_embeddings": True}}
    head = load_frozen_head(write_target(tmp_path / "t", tensors, config), "cpu", torch.float32)
    assert head.lm_head is head.embed and torch.equal(head.embed, embed)


def test_an_lm_head_of_another_shape_than_the_embedding_is_refused(tmp_path: Path) -> None:
    embed, lm_head = weights()
    tensors = {"model.embed_tokens.weight": embed, "lm_head.weight": lm_head[:, :8].contiguous()}
    target = write_target(tmp_path / "t", tensors, TEXT)
    with pytest.raises(
        ValueError,
        match=r"lm_head.weight has shape \(40, 8\) but model.embed_tokens.weight has \(40, 16\); "
        r"the drafter needs both \[vocab, hidden\]",
    ):
        load_frozen_head(target, "cpu", torch.float32)


@pytest.mark.parametrize("tied", [False, True])
def test_a_saved_transformers_model_gives_its_own_embedding_and_lm_head(
    tmp_path: Path, tied: bool
) -> None:
    config = Qwen3Config(
        vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, head_dim=8, tie_word_embeddings=tied,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config)
    model.save_pretrained(tmp_path / "qwen3")
    head = load_frozen_head(tmp_path / "qwen3", "cpu", torch.bfloat16)
    assert head.embed.dtype == head.lm_head.dtype == torch.bfloat16
    embed = model.get_input_embeddings().weight.detach().to(torch.bfloat16)
    lm_head = model.get_output_embeddings().weight.detach().to(torch.bfloat16)
    assert torch.equal(head.embed, embed) and torch.equal(head.lm_head, lm_head)
    assert (head.lm_head is head.embed) == tied


def test_a_random_head_is_untied_seeded_small_and_of_the_dtype_asked() -> None:
    head = FrozenHead.random(60, 24, "cpu", torch.bfloat16, seed=3)
    assert head.embed.shape == head.lm_head.shape == (60, 24)
    assert (head.vocab_size, head.hidden_size) == (60, 24)
    assert head.embed.dtype == head.lm_head.dtype == torch.bfloat16
    assert not torch.equal(head.embed, head.lm_head)
    again = FrozenHead.random(60, 24, "cpu", torch.bfloat16, seed=3)
    assert torch.equal(again.embed, head.embed) and torch.equal(again.lm_head, head.lm_head)
    other = FrozenHead.random(60, 24, "cpu", torch.bfloat16, seed=4)
    assert not torch.equal(other.embed, head.embed)
    for tensor in (head.embed, head.lm_head):
        assert 0.015 < tensor.float().std().item() < 0.025
