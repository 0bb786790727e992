"""A target's model directory as users bring it: a path under ~, a torn config.json, an
incomplete sharded download, wrappers whose text config lacks its model type or whose
quantization is declared at the top, and the key layouts of multimodal checkpoints (a
LLaVA-style language model, a vision tower stored beside the decoder layers)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from ringtrain.target.model_dir import TargetLoadError, TargetModelDir
from ringtrain.target.structure import read_target_config
from ringtrain.target.tiny import build_tiny_target
from tests.helpers.target_taps import cpu_taps
from tests.helpers.tiny_families import LAYERS, VOCAB, build_model, write_fp8

TAPS = [1, 3]


@pytest.fixture(scope="module")
def dense(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny dense Qwen3 target on disk (config.json, model.safetensors, tokenizer)."""
    return build_tiny_target(tmp_path_factory.mktemp("dense") / "qwen3", seed=5, hybrid=False)


def stored(directory: Path) -> dict[str, torch.Tensor]:
    return load_file(directory / "model.safetensors")


def taps_of(directory: Path, vocab: int = 512, taps: list[int] = TAPS) -> torch.Tensor:
    """The taps of one 19-token sequence, float32 on the CPU."""
    return cpu_taps(directory, taps, vocab, length=19)


def rewritten(
    source: Path, directory: Path, rename: dict[str, str], config: dict | None = None
) -> Path:
    """A copy of the target at `source` with each weight key's prefix renamed by `rename`
    (the first matching prefix) and, given, another config.json."""
    directory.mkdir(parents=True)
    tensors = {}
    for key, tensor in stored(source).items():
        prefix = next((p for p in rename if key.startswith(p)), "")
        tensors[rename.get(prefix, prefix) + key[len(prefix) :]] = tensor
    save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})
    text = json.loads((source / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps(config or text))
    return directory


def test_a_target_path_under_the_home_directory_is_expanded(
    dense: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rewritten(dense, tmp_path / "models" / "qwen3", {})
    monkeypatch.setenv("HOME", str(tmp_path))
    assert TargetModelDir("~/models/qwen3").path == tmp_path / "models" / "qwen3"
    assert read_target_config("~/models/qwen3").num_hidden_layers == 8


def test_a_torn_config_json_is_named_with_the_fix(dense: Path, tmp_path: Path) -> None:
    torn = rewritten(dense, tmp_path / "torn", {})
    text = (torn / "config.json").read_text()
    (torn / "config.json").write_text(text[: len(text) // 2])
    with pytest.raises(
        TargetLoadError, match=r"torn/config.json: not valid JSON \(.*re-download it"
    ):
        read_target_config(torn)


def test_an_index_listing_a_missing_shard_is_refused_as_an_incomplete_download(
    dense: Path, tmp_path: Path
) -> None:
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    (sharded / "config.json").write_text((dense / "config.json").read_text())
    tensors = stored(dense)
    keys = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": keys[::2],
              "model-00002-of-00002.safetensors": keys[1::2]}  # fmt: skip
    for name, shard_keys in shards.items():
        save_file({key: tensors[key] for key in shard_keys}, str(sharded / name))
    weight_map = {key: name for name, shard_keys in shards.items() for key in shard_keys}
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    assert read_target_config(sharded).num_hidden_layers == 8
    (sharded / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(
        TargetLoadError,
        match=r"lists weight files that are missing: \['.*/model-00002-of-00002\.safetensors'\]; "
        r"the download is incomplete \(fetch the missing shards\)",
    ):
        read_target_config(sharded)


def test_a_wrapper_whose_text_config_names_no_model_type_is_its_text_model(
    tmp_path: Path,
) -> None:
    hybrid = build_tiny_target(tmp_path / "hybrid", seed=3, hybrid=True)
    text = json.loads((hybrid / "config.json").read_text())
    del text["model_type"]
    wrapper = {"model_type": "qwen3_5", "text_config": text}
    nested = rewritten(hybrid, tmp_path / "nested", {"model.": "model.language_model."}, wrapper)
    config = read_target_config(nested)
    assert (config.model_type, config.num_hidden_layers) == ("qwen3_5_text", 8)
    torch.testing.assert_close(taps_of(nested), taps_of(hybrid), atol=0, rtol=0)


def test_a_llava_style_layout_reads_its_language_model(dense: Path, tmp_path: Path) -> None:
    """Weights under language_model.model. and language_model.lm_head, the text config
    under text_config (LLaVA's and Mistral 3's published layout)."""
    text = json.loads((dense / "config.json").read_text())
    wrapper = {"model_type": "llava", "text_config": text, "vision_config": {}}
    rename = {"model.": "language_model.model.", "lm_head.": "language_model.lm_head."}
    llava = rewritten(dense, tmp_path / "llava", rename, wrapper)
    assert TargetModelDir(llava).key_prefix == "language_model.model."
    torch.testing.assert_close(taps_of(llava), taps_of(dense), atol=0, rtol=0)


def test_a_vision_tower_stored_beside_the_decoder_layers_is_never_read(
    dense: Path, tmp_path: Path
) -> None:
    """Phi-4-multimodal keeps its image encoder under the language model's prefix
    (model.embed_tokens_extend.image_embed.img_processor.encoder.layers.N...): its layers
    are not decoder layers, and the loader must leave them unread."""
    beside = rewritten(dense, tmp_path / "beside", {})
    tensors = stored(beside)
    encoder = "model.embed_tokens_extend.image_embed.img_processor.encoder.layers"
    for layer in range(2):
        tensors[f"{encoder}.{layer}.mlp.fc1.weight"] = torch.ones(4, 4)
    save_file(tensors, str(beside / "model.safetensors"), metadata={"format": "pt"})
    torch.testing.assert_close(taps_of(beside), taps_of(dense), atol=0, rtol=0)


def test_a_wrappers_fp8_quantization_applies_to_its_language_model(tmp_path: Path) -> None:
    """quantization_config at the wrapper's top level (as the official -FP8 releases of
    multimodal models write it), none in text_config: the weights load dequantized."""
    meant = write_fp8(tmp_path / "fp8", build_model("qwen3_5"))
    meant.save_pretrained(tmp_path / "meant")
    config = json.loads((tmp_path / "fp8" / "config.json").read_text())
    assert "quantization_config" in config and "quantization_config" not in config["text_config"]
    taps = [1, LAYERS - 2]
    torch.testing.assert_close(
        taps_of(tmp_path / "fp8", VOCAB, taps), taps_of(tmp_path / "meant", VOCAB, taps)
    )


def test_a_cut_config_transformers_refuses_names_the_deepest_tap_and_the_fix(
    tmp_path: Path,
) -> None:
    """A hybrid whose only attention layer comes after the deepest tap: cut there, its
    config is one transformers refuses (no attention layer); the refusal is a
    TargetLoadError naming the layers kept and the fix, and a deeper cut builds."""
    from transformers import CONFIG_MAPPING

    values = CONFIG_MAPPING["olmo_hybrid"](
        hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
        num_hidden_layers=4, vocab_size=256,
        layer_types=["linear_attention"] * 3 + ["full_attention"],
    ).to_dict()  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(values))
    directory = TargetModelDir(tmp_path, weights=False)
    with pytest.raises(
        TargetLoadError,
        match=r"the olmo_hybrid config cut to its first 3 layers \(through the deepest tapped "
        r"layer, 2\) is refused by transformers \(.*at least one attention layer\); tap a "
        r"deeper layer \(\[target\] tap_layers\)",
    ):
        directory.text_config(3)
    assert directory.text_config(4).layer_types[-1] == "full_attention"
