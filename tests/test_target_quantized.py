"""Quantized targets load exactly what their weights mean, or are refused; never wrong."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, Mxfp4Config

from ringtrain.target.loader import load_target
from ringtrain.target.model_dir import TargetLoadError
from ringtrain.target.structure import read_target_config
from tests.helpers.target_taps import cpu_taps
from tests.helpers.tiny_families import LAYERS, VOCAB, build_model, write_fp8, write_mxfp4

TAPS = [1, 3, LAYERS - 1]


def taps_of(directory: Path) -> torch.Tensor:
    return cpu_taps(directory, TAPS, VOCAB)


def test_fp8_checkpoint_loads_the_dequantized_values(tmp_path: Path) -> None:
    meant = write_fp8(tmp_path / "fp8", build_model("qwen3"))
    meant.save_pretrained(tmp_path / "meant")
    with safe_open(str(tmp_path / "fp8" / "model.safetensors"), framework="pt") as handle:
        assert handle.get_tensor("model.layers.0.mlp.up_proj.weight").dtype == torch.float8_e4m3fn

    torch.testing.assert_close(taps_of(tmp_path / "fp8"), taps_of(tmp_path / "meant"))


def test_mxfp4_checkpoint_loads_what_transformers_dequantizes(tmp_path: Path) -> None:
    """gpt-oss's MXFP4 experts: the taps equal the hidden states of the full model that
    transformers itself loads dequantized."""
    directory = write_mxfp4(tmp_path / "mxfp4", build_model("gpt_oss"))
    full = AutoModelForCausalLM.from_pretrained(
        directory, quantization_config=Mxfp4Config(dequantize=True), dtype=torch.float32
    )
    ids = np.random.default_rng(0).integers(1, VOCAB, size=(1, 17))
    with torch.no_grad():
        hidden = full(input_ids=torch.from_numpy(ids), output_hidden_states=True).hidden_states
    expected = torch.cat([hidden[layer + 1][0] for layer in TAPS], dim=1)
    torch.testing.assert_close(taps_of(directory), expected, atol=1e-4, rtol=1e-5)


def test_fp8_weights_without_their_scheme_are_refused(tmp_path: Path) -> None:
    """float8 weights whose config.json lost its quantization_config: the scales would be
    ignored and the values wrong, so the load must fail, naming the unplaced scales."""
    write_fp8(tmp_path / "fp8", build_model("qwen3"))
    config_file = tmp_path / "fp8" / "config.json"
    config = json.loads(config_file.read_text())
    del config["quantization_config"]
    config_file.write_text(json.dumps(config))
    with pytest.raises(TargetLoadError, match=r"no place for: .*weight_scale_inv"):
        load_target(tmp_path / "fp8", tap_layers=TAPS, device="cpu", dtype="float32")


def test_unsupported_quantization_scheme_is_refused_in_preflight(tmp_path: Path) -> None:
    model = build_model("qwen3")
    model.save_pretrained(tmp_path / "gptq")
    config_file = tmp_path / "gptq" / "config.json"
    config = json.loads(config_file.read_text())
    config["quantization_config"] = {"quant_method": "gptq", "bits": 4}
    config_file.write_text(json.dumps(config))
    with pytest.raises(TargetLoadError, match=r"quantization scheme 'gptq' is not supported"):
        read_target_config(tmp_path / "gptq")


def test_weights_of_another_model_are_refused(tmp_path: Path) -> None:
    """A layer's weights missing from the files: never initialised at random."""
    model = build_model("llama")
    model.save_pretrained(tmp_path / "llama")
    weights = tmp_path / "llama" / "model.safetensors"
    with safe_open(str(weights), framework="pt") as handle:
        stored = handle.keys()
        state = {key: handle.get_tensor(key) for key in stored}
    del state["model.layers.2.mlp.down_proj.weight"]
    save_file(state, str(weights), metadata={"format": "pt"})
    with pytest.raises(
        TargetLoadError, match=r"without a weight in the checkpoint: layers\.2\.mlp"
    ):
        load_target(tmp_path / "llama", tap_layers=[3], device="cpu")
