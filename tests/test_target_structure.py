"""A target's structure as the pre-flight checks it: the parts the trainer hooks and
shares (a decoder layer stack, a token embedding, a final norm), which targets are hybrid,
the attention implementation each gets, and what ``read_target_config`` refuses or skips."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from transformers import CONFIG_MAPPING, PretrainedConfig

from ringtrain.target.model_dir import TargetLoadError
from ringtrain.target.structure import (
    base_model_class,
    check_structure,
    is_hybrid,
    read_target_config,
    resolve_attn_implementation,
)
from ringtrain.target.tiny import tiny_config

CPU = torch.device("cpu")
CUDA = torch.device("cuda")
PARTS = {
    "layers": "the stack of decoder layers whose outputs are tapped",
    "embed_tokens": "the token embedding the drafter shares",
    "norm": "the final norm, applied to a tap of the last layer",
}


def config_of(model_type: str, **values: object) -> PretrainedConfig:
    """transformers' config of `model_type`, its defaults but for `values`."""
    return CONFIG_MAPPING[model_type](**values)


def tiny(hybrid: bool, num_layers: int = 4) -> PretrainedConfig:
    """The built-in tiny target's config: a Qwen3.5 hybrid or a dense Qwen3."""
    values = tiny_config(vocab_size=300, hidden_size=32, num_layers=num_layers, hybrid=hybrid)
    return config_of(str(values.pop("model_type")), **values)


def write_config(directory: Path, values: dict) -> Path:
    """A target directory holding only config.json (its weights to be drawn at random)."""
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(values))
    return directory


def test_qwen3_5_with_linear_attention_layers_is_hybrid_and_qwen3_is_not() -> None:
    hybrid, dense = tiny(hybrid=True), tiny(hybrid=False)
    assert "full_attention" in hybrid.layer_types and is_hybrid(hybrid)
    assert dense.layer_types == ["full_attention"] * 4 and not is_hybrid(dense)
    assert not is_hybrid(config_of("gpt2"))  # no per-layer types at all


def test_auto_takes_sdpa_wherever_the_model_class_allows_it() -> None:
    for model_type in ("qwen3", "qwen3_5_text"):
        for device in (CPU, CUDA):
            assert resolve_attn_implementation("auto", config_of(model_type), device) == "sdpa"


def test_auto_without_sdpa_takes_flex_attention_on_cuda_and_eager_on_the_cpu() -> None:
    """gpt-oss's attention sinks are beyond SDPA."""
    gpt_oss = config_of("gpt_oss")
    assert resolve_attn_implementation("auto", gpt_oss, CUDA) == "flex_attention"
    assert resolve_attn_implementation("auto", gpt_oss, CPU) == "eager"


def test_a_named_implementation_the_model_supports_is_kept() -> None:
    qwen3, gpt_oss = config_of("qwen3"), config_of("gpt_oss")
    for setting in ("sdpa", "flex_attention", "eager"):
        assert resolve_attn_implementation(setting, qwen3, CUDA) == setting
    for setting in ("flex_attention", "eager"):
        assert resolve_attn_implementation(setting, gpt_oss, CPU) == setting
    assert resolve_attn_implementation("eager", config_of("qwen3_5_text"), CPU) == "eager"


@pytest.mark.parametrize(
    ("setting", "model_type", "model_class"),
    [("sdpa", "gpt_oss", "GptOssModel"), ("flex_attention", "qwen3_5_text", "Qwen3_5TextModel")],
)
def test_an_implementation_the_model_cannot_run_is_refused_with_the_fix(
    setting: str, model_type: str, model_class: str
) -> None:
    with pytest.raises(
        TargetLoadError,
        match=rf"attn_implementation = '{setting}': {model_class} does not support it; use 'auto'",
    ):
        resolve_attn_implementation(setting, config_of(model_type), CUDA)


def test_an_unknown_implementation_is_refused_with_the_choices() -> None:
    with pytest.raises(
        TargetLoadError,
        match=r"'flash_attention_2' is not one of 'auto', 'sdpa', 'eager', 'flex_attention'",
    ):
        resolve_attn_implementation("flash_attention_2", config_of("qwen3"), CUDA)


@pytest.mark.parametrize(
    ("model_type", "model_class", "lacking"),
    [
        ("gpt2", "GPT2Model", ["layers", "embed_tokens", "norm"]),  # h, wte, ln_f
        ("gpt_neox", "GPTNeoXModel", ["embed_tokens", "norm"]),  # embed_in, final_layer_norm
        ("phi", "PhiModel", ["norm"]),  # final_layernorm
    ],
)
def test_a_model_lacking_a_part_the_trainer_uses_is_refused_naming_each(
    model_type: str, model_class: str, lacking: list[str]
) -> None:
    """gpt2's config names its layer count n_layer, the others num_hidden_layers."""
    with pytest.raises(TargetLoadError) as refused:
        check_structure(config_of(model_type))
    named = ", ".join(f"'{name}' ({PARTS[name]})" for name in lacking)
    expected = f"model type '{model_type}' ({model_class}) cannot be a target: it lacks {named};"
    assert str(refused.value).startswith(expected)


@pytest.mark.parametrize("model_type", ["qwen3", "qwen3_5_text", "gpt_oss", "llama"])
def test_decoder_models_with_the_three_parts_pass(model_type: str) -> None:
    check_structure(config_of(model_type))


def test_a_model_type_without_a_base_model_class_is_refused() -> None:
    """blip's text decoder has a config but no headless model of its own."""
    blip_text = config_of("blip_text_model")
    with pytest.raises(
        TargetLoadError,
        match=r"model type 'blip_text_model': transformers has no base model class for it",
    ):
        base_model_class(blip_text)
    with pytest.raises(TargetLoadError, match=r"no base model class"):
        check_structure(blip_text)


def test_read_target_config_gives_the_full_config_of_a_random_weight_target(
    tmp_path: Path,
) -> None:
    """weights=False: config.json alone is enough, and no layer is cut."""
    values = tiny_config(vocab_size=300, hidden_size=32, num_layers=8, hybrid=True)
    config = read_target_config(write_config(tmp_path / "hybrid", values), weights=False)
    assert config.model_type == "qwen3_5_text" and config.num_hidden_layers == 8
    assert len(config.layer_types) == 8 and is_hybrid(config)


def test_read_target_config_checks_the_structure_unless_told_it_is_known(
    tmp_path: Path,
) -> None:
    gpt2 = write_config(tmp_path / "gpt2", config_of("gpt2", n_layer=2).to_dict())
    with pytest.raises(TargetLoadError, match=re.escape("(GPT2Model) cannot be a target")):
        read_target_config(gpt2, weights=False)
    assert read_target_config(gpt2, weights=False, structure=False).model_type == "gpt2"


def test_read_target_config_refuses_an_unsupported_quantization_without_weights(
    tmp_path: Path,
) -> None:
    values = tiny_config(vocab_size=300, hidden_size=32, num_layers=4, hybrid=False)
    values["quantization_config"] = {"quant_method": "awq", "bits": 4}
    target = write_config(tmp_path / "awq", values)
    with pytest.raises(TargetLoadError, match=r"quantization scheme 'awq' is not supported"):
        read_target_config(target, weights=False)
