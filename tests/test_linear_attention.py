"""target.linear_attention: which Gated DeltaNet implementation a hybrid target runs."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from ringtrain.target.linear_attention import (
    GATED_DELTA_RULE_FUNCTIONS,
    SHORT_CONVOLUTION_FUNCTION,
    fla_causal_conv1d_fn,
    linear_attention_backend,
    use_torch_linear_attention,
)
from ringtrain.target.loader import load_target
from ringtrain.target.model_dir import TargetLoadError, TargetModelDir
from ringtrain.target.tiny import build_tiny_target

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
