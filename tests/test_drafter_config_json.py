"""The drafter's config.json written into a checkpoint directory and read back as evaluation
reads it: the shape it takes from the target's config and the [drafter] config, the keys
that carry the tapped layers, the mask token and the trained causality, the configs of
other writers it reads (no known architecture, no layer_types, the block size at the top
level only), and the refusals that name what is missing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import Qwen3Config

from ringtrain.checkpoint.verify import checkpoint_spec
from ringtrain.drafter import drafter_spec_from_target
from ringtrain.drafter.config import PAPER_DRAFTER, DrafterConfig
from ringtrain.drafter.hf_config import hf_config_dict
from ringtrain.drafter.spec import DrafterSpec

TARGET = Qwen3Config(
    vocab_size=40, hidden_size=16, intermediate_size=24, num_hidden_layers=6,
    num_attention_heads=4, num_key_value_heads=2, head_dim=4, rms_norm_eps=1e-5,
)  # fmt: skip
TAPS = [1, 4]


def drafter(**overrides) -> DrafterConfig:
    """The paper's drafter of two layers and blocks of 4, with `overrides`."""
    return DrafterConfig(**{**PAPER_DRAFTER, "num_layers": 2, "block_size": 4, **overrides})


def write(directory: Path, config: DrafterSpec | dict) -> dict:
    """Write a checkpoint directory's config.json (a spec's, as a save writes it, or the
    given dict) and return what it holds."""
    raw = hf_config_dict(config) if isinstance(config, DrafterSpec) else config
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(raw, indent=2))
    return json.loads((directory / "config.json").read_text())


def test_the_drafters_own_head_count_is_written_beside_the_targets_head_size(
    tmp_path: Path,
) -> None:
    spec = drafter_spec_from_target(TARGET, drafter(num_attention_heads=2), TAPS)
    raw = write(tmp_path / "d", spec)
    assert (raw["num_attention_heads"], raw["num_key_value_heads"], raw["head_dim"]) == (2, 2, 4)
    engine = Qwen3Config.from_pretrained(tmp_path / "d")
    assert (engine.num_attention_heads, engine.head_dim) == (2, 4)
    assert checkpoint_spec(tmp_path / "d") == spec


def test_a_mask_token_id_of_0_is_the_drafters_and_minus_1_the_last_id(tmp_path: Path) -> None:
    spec = drafter_spec_from_target(TARGET, drafter(mask_token_id=0), TAPS)
    assert write(tmp_path / "zero", spec)["dflash_config"]["mask_token_id"] == 0
    assert checkpoint_spec(tmp_path / "zero").mask_token_id == 0
    unset = drafter_spec_from_target(TARGET, drafter(mask_token_id=-1), TAPS)
    assert write(tmp_path / "unset", unset)["dflash_config"]["mask_token_id"] == 39


def test_causal_sliding_attention_without_a_sliding_layer_is_written_bidirectional(
    tmp_path: Path,
) -> None:
    """sliding_attention only changes sliding layers: a drafter of full-attention layers
    alone trains bidirectional blocks whatever it says, and its config.json says so."""
    spec = drafter_spec_from_target(TARGET, drafter(sliding_attention="causal"), TAPS)
    assert spec.sliding_windows == (0, 0) and not spec.sliding_causal
    raw = write(tmp_path / "d", spec)
    assert (raw["is_causal"], raw["dflash_config"]["causal"]) == (False, False)
    assert checkpoint_spec(tmp_path / "d") == spec


def test_a_target_without_intermediate_size_needs_the_drafters_own() -> None:
    target = {k: v for k, v in TARGET.to_dict().items() if k != "intermediate_size"}
    with pytest.raises(
        ValueError,
        match=r"target config has no intermediate_size; set \[drafter\] intermediate_size",
    ):
        drafter_spec_from_target(target, drafter(), TAPS)
    assert (
        drafter_spec_from_target(target, drafter(intermediate_size=32), TAPS).intermediate_size
        == 32
    )


def test_the_tapped_layers_are_written_and_read_in_their_listed_order(tmp_path: Path) -> None:
    """The drafter's input columns are the taps in the listed order; the engines feed them
    in the order of target_layer_ids."""
    spec = drafter_spec_from_target(TARGET, drafter(), [4, 1])
    assert write(tmp_path / "d", spec)["dflash_config"]["target_layer_ids"] == [4, 1]
    assert checkpoint_spec(tmp_path / "d").tap_layers == (4, 1)


@pytest.mark.parametrize("architectures", [["Qwen3ForCausalLM"], None])
def test_a_config_json_naming_no_known_architecture_is_read_as_dflash(
    tmp_path: Path, architectures: list[str] | None
) -> None:
    spec = drafter_spec_from_target(TARGET, drafter(), TAPS)
    raw = hf_config_dict(spec)
    if architectures is None:
        del raw["architectures"]
    else:
        raw["architectures"] = architectures
    write(tmp_path / "d", raw)
    read = checkpoint_spec(tmp_path / "d")
    assert read.architecture == "dflash" and read == spec


def test_a_dflash2_config_json_without_its_settings_is_refused_naming_them(
    tmp_path: Path,
) -> None:
    spec = drafter_spec_from_target(TARGET, drafter(architecture="dflash2"), TAPS)
    raw = hf_config_dict(spec)
    assert raw["architectures"] == ["DFlash2DraftModel"]
    write(tmp_path / "whole", raw)
    assert checkpoint_spec(tmp_path / "whole") == spec
    del raw["dflash_config"]["selector_rank"], raw["dflash_config"]["selector_top_k"]
    write(tmp_path / "lacking", raw)
    with pytest.raises(
        ValueError,
        match=r"lacking/config.json: a DFlash2DraftModel config.json needs dflash_config keys "
        r"\['selector_rank', 'selector_top_k'\]; the engines refuse such a drafter without them",
    ):
        checkpoint_spec(tmp_path / "lacking")


def test_is_causal_is_read_before_vllms_dflash_config_causal(tmp_path: Path) -> None:
    """SGLang, vLLM and the DFlash reference read the top-level is_causal first; vLLM
    falls back to dflash_config.causal."""
    cfg = drafter(sliding_windows=[8, 8], sliding_attention="causal")
    raw = hf_config_dict(drafter_spec_from_target(TARGET, cfg, TAPS))
    assert (raw["is_causal"], raw["dflash_config"]["causal"]) == (True, True)
    write(tmp_path / "top", {**raw, "is_causal": False})
    assert not checkpoint_spec(tmp_path / "top").sliding_causal
    write(tmp_path / "vllm", {k: v for k, v in raw.items() if k != "is_causal"})
    assert checkpoint_spec(tmp_path / "vllm").sliding_causal


def test_a_block_size_at_the_top_level_only_is_read(tmp_path: Path) -> None:
    """A config.json with its block size at the top level only is read with it; where
    dflash_config has one too, that one is read."""
    spec = drafter_spec_from_target(TARGET, drafter(block_size=6), TAPS)
    raw = hf_config_dict(spec)
    assert raw["block_size"] == raw["dflash_config"]["block_size"] == 6
    write(tmp_path / "both", {**raw, "block_size": 16})
    assert checkpoint_spec(tmp_path / "both").block_size == 6
    del raw["dflash_config"]["block_size"]
    write(tmp_path / "top", raw)
    assert checkpoint_spec(tmp_path / "top") == spec


def test_a_config_json_without_layer_types_is_read_as_full_attention(tmp_path: Path) -> None:
    spec = drafter_spec_from_target(TARGET, drafter(), TAPS)
    raw = hf_config_dict(spec)
    assert raw["layer_types"] == ["full_attention", "full_attention"]
    del raw["layer_types"]
    write(tmp_path / "d", raw)
    read = checkpoint_spec(tmp_path / "d")
    assert read.sliding_windows == (0, 0) and read == spec


@pytest.mark.parametrize("value", [None, ["block_size"]])
def test_a_dflash_config_that_is_no_object_is_refused_naming_it(
    value: object, tmp_path: Path
) -> None:
    """`"dflash_config": null` (or a list) is no DFlash drafter: a ValueError naming the
    value, which the checkpoint search skips, not an AttributeError that would end it."""
    raw = hf_config_dict(drafter_spec_from_target(TARGET, drafter(), TAPS))
    raw["dflash_config"] = value
    write(tmp_path / "d", raw)
    with pytest.raises(ValueError, match=r"d/config.json: drafter config.json has dflash_config ="):
        checkpoint_spec(tmp_path / "d")
