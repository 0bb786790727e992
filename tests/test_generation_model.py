"""Loading a local causal LM for generation, and the facts about it generation relies on:
which targets' KV caches can be cut back exactly, and which ids end a generation."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, MistralConfig, MistralForCausalLM, Qwen3Config

from ringtrain.eval.speculative import plain_generate
from ringtrain.eval.target import VerifyingTarget
from ringtrain.generate.model import load_causal_lm, stop_token_ids, supports_cache_rollback
from ringtrain.target.tiny import EOS_TOKEN_ID, build_tiny_target, tiny_config

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = {
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 16,
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_target(
        tmp_path_factory.mktemp("tiny"), seed=2, hybrid=False, num_layers=2, hidden_size=32
    )


# ---- whose KV cache can be cut back ---------------------------------------------------


def test_full_attention_targets_can_be_cut_back() -> None:
    assert supports_cache_rollback(Qwen3Config(**SMALL))
    assert supports_cache_rollback(LlamaConfig(**SMALL))  # no layer_types at all


def test_a_hybrid_target_cannot_be_cut_back() -> None:
    hybrid = tiny_config(vocab_size=300, hidden_size=32, num_layers=4, hybrid=True)
    assert "full_attention" in hybrid["layer_types"]
    assert not supports_cache_rollback(Qwen3Config(**{**SMALL, **hybrid}))


def test_sliding_window_targets_cannot_be_cut_back() -> None:
    # Qwen2-style: the switch on, though the layers this config lists are all full.
    switched = Qwen3Config(**SMALL, use_sliding_window=True, sliding_window=8, max_window_layers=2)
    assert set(switched.layer_types) == {"full_attention"}
    assert not supports_cache_rollback(switched)
    # Mistral-style: no layer_types, a window on every layer.
    assert not supports_cache_rollback(MistralConfig(**SMALL, sliding_window=4))
    assert supports_cache_rollback(MistralConfig(**SMALL, sliding_window=None))


def test_a_sliding_window_target_decodes_as_transformers_does() -> None:
    """Past its window a sliding-window target's own decoding is the model's."""
    torch.manual_seed(0)
    model = MistralForCausalLM(MistralConfig(**SMALL, sliding_window=4)).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.ndim > 1:
                parameter.normal_(std=0.3)
    prompt = torch.tensor([1, 5, 9, 3, 7, 2, 8, 4, 6, 10, 11, 12])
    expected = model.generate(prompt[None], max_new_tokens=8, do_sample=False)[0, len(prompt) :]
    assert plain_generate(VerifyingTarget(model, [0]), prompt, 8).tokens == expected.tolist()


# ---- which ids end a generation -------------------------------------------------------


@pytest.mark.parametrize(
    ("eos", "expected"), [(7, [7]), ([2, 9, 4], [2, 9, 4]), (0, [0]), (None, [])]
)
def test_every_end_of_sequence_id_stops(eos: object, expected: list[int]) -> None:
    assert stop_token_ids(Qwen3Config(**SMALL, eos_token_id=eos)) == expected


# ---- loading ----------------------------------------------------------------------------


def test_the_model_loads_frozen_in_the_dtype_asked_for(tiny: Path) -> None:
    model = load_causal_lm(tiny, dtype="bfloat16")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert not any(p.requires_grad for p in model.parameters())
    assert not model.training
    assert model.config.eos_token_id == EOS_TOKEN_ID
    assert {p.dtype for p in load_causal_lm(tiny, dtype="float32").parameters()} == {torch.float32}


def test_a_home_relative_path_is_expanded(tiny: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tiny.parent))
    model = load_causal_lm(f"~/{tiny.name}", dtype="float32")
    assert model.config.vocab_size == 512


def test_a_directory_without_config_json_is_refused_by_name(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match=r"no config\.json; the target must be a local"):
        load_causal_lm(tmp_path)
