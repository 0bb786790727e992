"""target.linear_attention: which Gated DeltaNet implementation a hybrid target runs."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformers import Qwen3_5TextConfig

from ringtrain.config import parse_config
from ringtrain.target import loader
from ringtrain.target.compiled import compiled_forward
from ringtrain.target.linear_attention import (
    CHUNK_RULE_FUNCTION,
    GATED_DELTA_RULE_FUNCTIONS,
    SHORT_CONVOLUTION_FUNCTION,
    choose_linear_attention,
    fla_causal_conv1d_fn,
    linear_attention_backend,
    normalized_qkv,
    repeats_grouped_heads,
    use_normalized_qk,
    use_torch_linear_attention,
    with_normalized_qk,
)
from ringtrain.target.loader import load_target
from ringtrain.target.model_dir import TargetLoadError, TargetModelDir
from ringtrain.target.structure import check_structure
from ringtrain.target.tiny import build_tiny_target
from ringtrain.trainer import plan
from ringtrain.trainer.roles import rank_info_from_env
from tests.helpers.launcher import as_torchrun_rank

FLA_INSTALLED = importlib.util.find_spec("fla") is not None


def _forward(target, input_ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return target.module(input_ids=input_ids).last_hidden_state


@pytest.mark.skipif(FLA_INSTALLED, reason="with FLA installed a hybrid target refuses the CPU")
def test_torch_choice_swaps_the_dispatching_functions_for_transformers_own(
    tmp_path: Path,
) -> None:
    path = build_tiny_target(tmp_path / "t", seed=3)
    ids = torch.randint(0, 512, (2, 40), generator=torch.Generator().manual_seed(0))
    auto = load_target(path, num_taps=3, device="cpu", dtype="float32")
    before = _forward(auto, ids)
    torch_target = load_target(
        path, num_taps=3, device="cpu", dtype="float32", linear_attention="torch"
    )
    assert torch_target.linear_attention == "torch"
    layer = next(m for m in torch_target.module.modules() if "GatedDeltaNet" in type(m).__name__)
    modeling = sys.modules[type(layer).__module__]
    for name in GATED_DELTA_RULE_FUNCTIONS:
        assert not hasattr(getattr(modeling, name), "__wrapped__"), name
    assert use_torch_linear_attention(torch_target.module) == 0  # already swapped
    torch.testing.assert_close(_forward(torch_target, ids), before)


@pytest.mark.skipif(FLA_INSTALLED, reason="with FLA installed a hybrid target refuses the CPU")
def test_queries_and_keys_normalised_before_the_recurrence_give_the_same_layers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = build_tiny_target(tmp_path / "t", seed=6)
    target = load_target(path, num_taps=3, device="cpu", dtype="float32")
    ids = torch.randint(0, 512, (2, 40), generator=torch.Generator().manual_seed(1))
    before = _forward(target, ids)
    layer = next(m for m in target.module.modules() if "GatedDeltaNet" in type(m).__name__)
    modeling = sys.modules[type(layer).__module__]
    chunk_rule = getattr(modeling, CHUNK_RULE_FUNCTION)
    asked = []

    def recurrence(*args, **kwargs):
        asked.append(kwargs["use_qk_l2norm_in_kernel"])
        return chunk_rule(*args, **kwargs)

    monkeypatch.setattr(modeling, CHUNK_RULE_FUNCTION, recurrence)  # restored after the test
    layouts = []

    def prepare(query, key, value):
        prepared = normalized_qkv(query, key, value)
        layouts.append((query.is_contiguous(), [t.is_contiguous() for t in prepared]))
        return prepared

    assert use_normalized_qk(target.module, prepare) == 1
    assert use_normalized_qk(target.module, prepare) == 0  # already switched
    after = _forward(target, ids)
    # Strided views in, contiguous tensors out, and the recurrence no longer normalises.
    assert layouts and all(not given and all(out) for given, out in layouts)
    assert asked and not any(asked)
    torch.testing.assert_close(after, before, atol=1e-5, rtol=1e-5)


def test_a_dense_target_has_no_linear_attention(tmp_path: Path) -> None:
    path = build_tiny_target(tmp_path / "d", hybrid=False)
    config = TargetModelDir(path).text_config()
    assert linear_attention_backend(config, torch.device("cpu"), "torch") is None
    assert load_target(path, num_taps=3, device="cpu").linear_attention is None


@pytest.mark.skipif(FLA_INSTALLED, reason="checks the refusal where FLA is missing")
def test_fla_choice_without_fla_is_refused_with_the_fix(tmp_path: Path) -> None:
    config = TargetModelDir(build_tiny_target(tmp_path / "t")).text_config()
    with pytest.raises(TargetLoadError, match=r"flash-linear-attention is not installed.*torch"):
        linear_attention_backend(config, torch.device("cuda"), "fla")
    assert linear_attention_backend(config, torch.device("cpu"), "auto") == "torch"


@pytest.mark.gpu
@pytest.mark.skipif(
    not (torch.cuda.is_available() and FLA_INSTALLED),
    reason="needs a CUDA GPU and flash-linear-attention",
)
@pytest.mark.skipif(
    importlib.util.find_spec("causal_conv1d") is not None,
    reason="the causal_conv1d package, where installed, keeps the short convolutions",
)
def test_fla_short_convolution_runs_and_equals_the_depthwise_convolution(tmp_path: Path) -> None:
    path = build_tiny_target(tmp_path / "t", seed=3)
    target = load_target(path, num_taps=3, device="cuda", compile="off")
    assert target.linear_attention == "fla"
    layer = next(m for m in target.module.modules() if "GatedDeltaNet" in type(m).__name__)
    assert getattr(sys.modules[type(layer).__module__], SHORT_CONVOLUTION_FUNCTION) is (
        fla_causal_conv1d_fn
    )
    generator = torch.Generator(device="cuda").manual_seed(0)
    channels, length = 96, 70
    weight = torch.randn(channels, 4, device="cuda", generator=generator)
    # [batch, channels, time] as a transposed projection (training) and contiguous (a
    # cached prefill concatenates the history along time).
    rows = torch.randn(2, length, channels, device="cuda", generator=generator)
    for inputs in (rows.transpose(1, 2), rows.transpose(1, 2).contiguous()):
        padded = F.conv1d(inputs, weight.unsqueeze(1), padding=3, groups=channels)
        reference = F.silu(padded[..., :length])
        out = fla_causal_conv1d_fn(
            inputs.bfloat16(), weight.bfloat16(), None, activation="silu", seq_idx=None
        )
        assert out.shape == inputs.shape
        torch.testing.assert_close(out.float(), reference, atol=0.05, rtol=0.02)


@pytest.mark.gpu
@pytest.mark.skipif(
    not (torch.cuda.is_available() and FLA_INSTALLED),
    reason="needs a CUDA GPU and flash-linear-attention",
)
def test_compiled_normalisation_equals_fla_s_own_on_the_layer_s_strided_views() -> None:
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    generator = torch.Generator(device="cuda").manual_seed(0)
    batch, length, heads, width = 2, 300, 4, 128
    mixed = torch.randn(batch, length, 3 * heads * width, device="cuda", generator=generator)
    query, key, value = (
        part.reshape(batch, length, heads, width)
        for part in mixed.bfloat16().split(heads * width, -1)
    )
    g = -torch.rand(batch, length, heads, device="cuda", generator=generator)
    beta = torch.rand(batch, length, heads, device="cuda", generator=generator).bfloat16()
    expected, _ = chunk_gated_delta_rule(
        query, key, value, g=g, beta=beta, use_qk_l2norm_in_kernel=True
    )
    prepare = compiled_forward(normalized_qkv, "inductor")
    out, _ = with_normalized_qk(chunk_gated_delta_rule, prepare)(
        query, key, value, g=g, beta=beta, use_qk_l2norm_in_kernel=True
    )
    torch.testing.assert_close(out, expected, atol=2e-2, rtol=2e-2)
    prepared = prepare(query, key, value)
    assert all(t.is_contiguous() for t in prepared)
    unit = prepared[0].float().norm(dim=-1)
    torch.testing.assert_close(unit, torch.ones_like(unit), atol=1e-2, rtol=0)


@pytest.mark.parametrize("role", ["target", "drafter"])
def test_a_target_rank_chooses_its_kernels_before_the_structure_check_imports_fla(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, role: str
) -> None:
    """FLA reads its tuned kernel configurations only when it is imported, and the
    structure check imports the model's code (and with it FLA): a target rank's pre-flight
    and the loader choose the kernels (pointing FLA at the shipped configurations) first.
    A drafter rank runs no Gated DeltaNet kernel and chooses none."""
    path = build_tiny_target(tmp_path / "t")
    calls: list[str] = []

    def choose(config, device, choice):
        calls.append("choose")
        return choose_linear_attention(config, device, choice)

    def check(config) -> None:
        calls.append("check")
        check_structure(config)

    for module in (plan, loader):
        monkeypatch.setattr(module, "choose_linear_attention", choose)
        monkeypatch.setattr(module, "check_structure", check)
    rank = 0 if role == "target" else 2  # the default layout: 2 targets, 1 drafter
    as_torchrun_rank(monkeypatch, rank, rank)
    config = parse_config("", overrides=[f"target.path={json.dumps(str(path))}"])
    info = rank_info_from_env(config.layout, "cpu")
    assert info.role == role
    plan._target_and_taps(config, path, info)
    assert calls == (["choose", "check"] if role == "target" else ["check"])
    calls.clear()
    load_target(path, num_taps=3, device="cpu")
    assert calls == ["choose", "check"]


@pytest.mark.parametrize(
    ("version", "key_heads", "repeats"),
    [("5.17.0", 16, True), ("5.22.1.dev0", 16, True), ("5.23.0", 16, False), ("5.17.0", 32, False)],
)
def test_transformers_releases_that_copy_grouped_heads_are_told_apart(
    version: str, key_heads: int, repeats: bool
) -> None:
    """Releases before 5.23 copy a Gated DeltaNet's queries and keys per value head before
    FLA (the loader then says which release passes them as they are); not with as many key
    heads as value heads."""
    config = Qwen3_5TextConfig(linear_num_key_heads=key_heads, linear_num_value_heads=32)
    assert repeats_grouped_heads(config, version) is repeats
