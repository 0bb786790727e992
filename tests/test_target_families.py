"""Every target family loads from its hub layout and taps exactly what Hugging Face computes.

For each family a tiny random model of the real transformers class is written with
``save_pretrained`` (MoE: one tensor per expert, as published) and, for MoE, also with
fused expert stacks. Its taps for a right-padded batch of two sequences must equal the
full model's ``hidden_states[i + 1]`` of each sequence run alone, for taps spread over
the depth including the last layer; and the loader must hand transformers only the
embedding, the kept layers and (for a tap of the last layer) the final norm.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from ringtrain.target.loader import load_target
from ringtrain.target.model_dir import TargetModelDir, layer_index
from ringtrain.target.runner import TargetRunner
from tests.helpers.tiny_families import (
    ALL_FAMILIES,
    LAYERS,
    MOE_FAMILIES,
    SEQUENCE_LENGTHS,
    VOCAB,
    Padded,
    build_model,
    record_handed_keys,
    write_model,
)

LAYOUTS = [(family, False) for family in ALL_FAMILIES] + [
    (family, True) for family in (*MOE_FAMILIES, "qwen3_5_moe") if family != "gpt_oss"
]


def reference_hidden_states(
    model: torch.nn.Module, sequence: np.ndarray
) -> tuple[torch.Tensor, ...]:
    """The full HF model's hidden states for one sequence run alone (float32)."""
    with torch.no_grad():
        return model(
            input_ids=torch.from_numpy(sequence)[None], output_hidden_states=True
        ).hidden_states


@pytest.mark.parametrize(("family", "fused"), LAYOUTS, ids=lambda v: str(v))
def test_taps_equal_hf_hidden_states(
    family: str, fused: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = build_model(family)
    directory = write_model(tmp_path / family, model, fused=fused)
    handed = record_handed_keys(monkeypatch)
    taps = [1, 3, LAYERS - 1]
    target = load_target(directory, tap_layers=taps, device="cpu", dtype="float32")

    rng = np.random.default_rng(0)
    sequences = [rng.integers(1, VOCAB, size=n) for n in SEQUENCE_LENGTHS]
    runner = TargetRunner(target)
    rows = runner.prefetch(Padded(sequences))
    out = torch.full((rows, target.tap_width), float("nan"))
    runner.forward_into(out)

    hidden = target.hidden_size
    start = 0
    for sequence in sequences:
        reference = reference_hidden_states(model, sequence)
        for k, layer in enumerate(taps):
            torch.testing.assert_close(
                out[start : start + len(sequence), k * hidden : (k + 1) * hidden],
                reference[layer + 1][0],
                atol=1e-4,
                rtol=0,
                msg=lambda m, layer=layer: f"{family}: tap of layer {layer}: {m}",
            )
        start += len(sequence)
    assert start == rows
    # Only the embedding, layers 0..L-1 and the final norm (needed for the tap of L-1).
    assert all(key.startswith(("embed_tokens.", "layers.", "norm.")) for key in handed), sorted(
        handed
    )


@pytest.mark.parametrize("family", ["qwen3_moe", "deepseek_v3", "qwen3_5_moe"])
def test_dropped_layers_norm_head_and_vision_are_never_read(
    family: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = write_model(tmp_path / family, build_model(family))
    handed = record_handed_keys(monkeypatch)
    target = load_target(directory, tap_layers=[2, 1], device="cpu", dtype="float32")

    assert len(target.module.layers) == 3
    assert isinstance(target.module.norm, torch.nn.Identity)
    assert not hasattr(target.module, "lm_head")
    layers = {layer_index(key) for key in handed} - {None}
    assert layers == {0, 1, 2}
    assert {key for key in handed if layer_index(key) is None} == {"embed_tokens.weight"}
    checkpoint = TargetModelDir(directory)
    vision = [key for key in checkpoint.keys if "visual" in key]
    assert (family == "qwen3_5_moe") == bool(vision)  # the wrapper's tower exists, unread
