"""A local model directory whose weight files lack some of the model's weights is refused.

transformers fills missing weights with random values and only logs it; generation
(`regenerate --local`, `synthesize`, `ringtrain-eval`) loads through
ringtrain.generate.model.load_causal_lm, which refuses such a directory by name. Tied
weights (an LM head sharing the embedding) are not missing.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file
from transformers import Qwen3Config, Qwen3ForCausalLM

from ringtrain.cli.data import main as data_main
from ringtrain.generate.model import load_causal_lm
from tests.helpers.word_chat_model import build_word_chat_model

pytestmark = pytest.mark.usefixtures("one_thread")

MLP_WEIGHTS = [
    f"model.layers.0.mlp.{name}.weight" for name in ("down_proj", "gate_proj", "up_proj")
]


def _without_mlp(directory: Path) -> Path:
    """``directory``'s model with the MLP weights of layer 0 removed from its weight file."""
    weights_file = directory / "model.safetensors"
    weights = load_file(weights_file)
    kept = {name: tensor for name, tensor in weights.items() if name not in MLP_WEIGHTS}
    assert len(kept) == len(weights) - len(MLP_WEIGHTS)
    save_file(kept, str(weights_file), metadata={"format": "pt"})
    return directory


def test_missing_weights_are_refused_by_name(tmp_path: Path) -> None:
    model = _without_mlp(build_word_chat_model(tmp_path / "model"))
    with pytest.raises(ValueError, match="lack 3 of the model's weights") as refusal:
        load_causal_lm(model)
    assert all(name in str(refusal.value) for name in MLP_WEIGHTS)


def test_a_tied_lm_head_is_not_missing(tmp_path: Path) -> None:
    config = Qwen3Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        tie_word_embeddings=True,
    )
    Qwen3ForCausalLM(config).save_pretrained(tmp_path)
    model = load_causal_lm(tmp_path)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_synthesize_refuses_the_model_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = _without_mlp(build_word_chat_model(tmp_path / "model"))
    output = tmp_path / "prompts.jsonl"
    argv = ["synthesize", "--target", str(model), "--output", str(output), "--num", "2"]
    assert data_main([*argv, "--device", "cpu", "--no-progress"]) == 2
    errors = capsys.readouterr().err
    assert "Traceback" not in errors
    last = errors.splitlines()[-1]
    assert last.startswith("ringtrain-data: error: --target ") and MLP_WEIGHTS[0] in last
    assert not output.exists() or output.read_text() == ""


def test_regenerate_local_refuses_the_model_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = _without_mlp(build_word_chat_model(tmp_path / "model"))
    chats = tmp_path / "chats.jsonl"
    chats.write_text('{"messages": [{"role": "user", "content": "hello"}]}\n')
    output = tmp_path / "out.jsonl"
    argv = ["regenerate", "--local", str(model), "--device", "cpu", "--threads", "1"]
    assert data_main([*argv, "--input", str(chats), "--output", str(output)]) == 2
    errors = capsys.readouterr().err
    assert "Traceback" not in errors
    last = errors.splitlines()[-1]
    assert "--local " in last and MLP_WEIGHTS[0] in last, last
    assert not output.exists()
