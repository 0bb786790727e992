"""target.linear_attention, decided without a GPU: the implementation chosen for each
choice with flash-linear-attention installed or not (a stand-in package on the import
path), the switches made on a loaded hybrid model's modeling module, what the loader is
told runs, and the queries and keys normalised before the recurrence."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import logging
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch
from transformers import CONFIG_MAPPING, AutoModel, PretrainedConfig

from ringtrain.target import linear_attention
from ringtrain.target.linear_attention import (
    GATED_DELTA_RULE_FUNCTIONS,
    SHORT_CONVOLUTION_FUNCTION,
    choose_linear_attention,
    fla_causal_conv1d_fn,
    linear_attention_backend,
    normalized_qkv,
    settle_linear_attention,
    use_torch_linear_attention,
    with_normalized_qk,
)
from ringtrain.target.model_dir import TargetLoadError
from ringtrain.target.tiny import tiny_config

FLA_INSTALLED = importlib.util.find_spec("fla") is not None
CAUSAL_CONV1D_INSTALLED = importlib.util.find_spec("causal_conv1d") is not None
CUDA = torch.device("cuda")  # a device name: nothing here runs on it
CPU = torch.device("cpu")
without_fla = pytest.mark.skipif(FLA_INSTALLED, reason="checks a machine without FLA")


def config_of(*, hybrid: bool) -> PretrainedConfig:
    values = tiny_config(vocab_size=300, hidden_size=32, num_layers=4, hybrid=hybrid)
    return CONFIG_MAPPING[values["model_type"]].from_dict(values)


@pytest.fixture(scope="module")
def hybrid_model() -> torch.nn.Module:
    """A tiny hybrid model (the modeling module imported before any stand-in package)."""
    return AutoModel.from_config(config_of(hybrid=True))


@pytest.fixture
def modeling(hybrid_model: torch.nn.Module, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The hybrid model's modeling module, its functions restored after the test; the
    dispatching functions plain (no torch function to switch back to) unless a test
    wraps them."""
    layer = next(m for m in hybrid_model.modules() if "GatedDeltaNet" in type(m).__name__)
    module = sys.modules[type(layer).__module__]
    for name in GATED_DELTA_RULE_FUNCTIONS:
        monkeypatch.setattr(module, name, lambda *args, **kwargs: None)
    monkeypatch.setattr(
        module, SHORT_CONVOLUTION_FUNCTION, getattr(module, SHORT_CONVOLUTION_FUNCTION)
    )
    return module


@pytest.fixture
def install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hybrid_model: torch.nn.Module
) -> Iterator[Callable[[str], None]]:
    """Make an (empty) package of that name findable on the import path for one test
    (after the modeling module is imported: it imports FLA where it finds it)."""
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    names: list[str] = []

    def installed(name: str) -> None:
        (site / name).mkdir()
        (site / name / "__init__.py").write_text("")
        importlib.invalidate_caches()
        names.append(name)

    yield installed
    for name in names:
        sys.modules.pop(name, None)
    importlib.invalidate_caches()


def wrap_torch_functions(module: ModuleType, monkeypatch: pytest.MonkeyPatch) -> dict[str, object]:
    """Dispatching functions that keep their torch function as __wrapped__, as
    transformers binds them; returns the torch functions by name."""
    originals = {}
    for name in GATED_DELTA_RULE_FUNCTIONS:

        def torch_function(*args: object, **kwargs: object) -> None:
            return None

        dispatching = functools.wraps(torch_function)(lambda *args, **kwargs: None)
        monkeypatch.setattr(module, name, dispatching)
        originals[name] = torch_function
    return originals


def test_with_fla_installed_a_gpu_runs_it_unless_torch_is_asked(install: Callable) -> None:
    install("fla")
    hybrid = config_of(hybrid=True)
    assert linear_attention_backend(hybrid, CUDA, "auto") == "fla"
    assert linear_attention_backend(hybrid, CUDA, "fla") == "fla"
    assert linear_attention_backend(hybrid, CUDA, "torch") == "torch"
    assert linear_attention_backend(config_of(hybrid=False), CUDA, "auto") is None
    for choice in ("auto", "torch"):
        with pytest.raises(TargetLoadError, match=r"installed but the hybrid target runs on cpu"):
            linear_attention_backend(hybrid, CPU, choice)


@without_fla
def test_without_fla_auto_and_torch_run_torch() -> None:
    hybrid = config_of(hybrid=True)
    for device in (CUDA, CPU):
        assert linear_attention_backend(hybrid, device, "auto") == "torch"
        assert linear_attention_backend(hybrid, device, "torch") == "torch"


def test_fla_is_pointed_at_the_shipped_configurations_only_where_it_runs(
    install: Callable, monkeypatch: pytest.MonkeyPatch
) -> None:
    pointed: list[torch.device] = []
    monkeypatch.setattr(linear_attention, "use_shipped_fla_configs", pointed.append)
    install("fla")
    hybrid = config_of(hybrid=True)
    assert choose_linear_attention(hybrid, CUDA, "torch") == "torch"
    assert choose_linear_attention(config_of(hybrid=False), CUDA, "auto") is None
    assert pointed == []
    assert choose_linear_attention(hybrid, CUDA, "auto") == "fla"
    assert pointed == [CUDA]


def test_the_torch_choice_puts_transformers_torch_functions_back(
    hybrid_model: torch.nn.Module, modeling: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    originals = wrap_torch_functions(modeling, monkeypatch)
    assert use_torch_linear_attention(hybrid_model) == 2
    assert {name: getattr(modeling, name) for name in originals} == originals
    assert use_torch_linear_attention(hybrid_model) == 0


@pytest.mark.parametrize("fla", [True, False])
def test_a_torch_choice_runs_torch_where_the_functions_switch_back(
    hybrid_model: torch.nn.Module,
    modeling: ModuleType,
    monkeypatch: pytest.MonkeyPatch,
    install: Callable,
    fla: bool,
) -> None:
    if fla:
        install("fla")
    elif FLA_INSTALLED:
        pytest.skip("FLA is installed")
    wrap_torch_functions(modeling, monkeypatch)
    assert settle_linear_attention(hybrid_model, "torch", "torch", CUDA) == "torch"


def test_a_torch_choice_transformers_cannot_honour_is_reported_as_fla(
    hybrid_model: torch.nn.Module,
    modeling: ModuleType,
    install: Callable,
    caplog: pytest.LogCaptureFixture,
) -> None:
    install("fla")
    with caplog.at_level(logging.WARNING, logger=linear_attention.__name__):
        assert settle_linear_attention(hybrid_model, "torch", "torch", CUDA) == "fla"
    assert "offers no torch Gated DeltaNet to switch to" in caplog.text


@without_fla
def test_without_fla_nothing_to_switch_back_still_runs_torch(
    hybrid_model: torch.nn.Module, modeling: ModuleType, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger=linear_attention.__name__):
        assert settle_linear_attention(hybrid_model, "torch", "torch", CUDA) == "torch"
        assert settle_linear_attention(hybrid_model, "torch", "auto", CPU) == "torch"
    assert caplog.text == ""


def test_the_slow_fallback_is_announced_only_where_auto_found_no_fla(
    hybrid_model: torch.nn.Module, modeling: ModuleType, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger=linear_attention.__name__):
        settle_linear_attention(hybrid_model, "torch", "torch", CUDA)
        settle_linear_attention(hybrid_model, "torch", "auto", CPU)
    assert "slow torch fallback" not in caplog.text
    with caplog.at_level(logging.WARNING, logger=linear_attention.__name__):
        settle_linear_attention(hybrid_model, "torch", "auto", CUDA)
    assert "slow torch fallback on GPU (install the 'gpu' extra)" in caplog.text


@pytest.mark.skipif(CAUSAL_CONV1D_INSTALLED, reason="checks a machine without causal_conv1d")
def test_fla_runs_the_short_convolutions_where_causal_conv1d_is_missing(
    hybrid_model: torch.nn.Module, modeling: ModuleType
) -> None:
    transformers_own = getattr(modeling, SHORT_CONVOLUTION_FUNCTION)
    assert settle_linear_attention(hybrid_model, "torch", "auto", CPU) == "torch"
    assert getattr(modeling, SHORT_CONVOLUTION_FUNCTION) is transformers_own
    assert settle_linear_attention(hybrid_model, "fla", "auto", CUDA) == "fla"
    assert getattr(modeling, SHORT_CONVOLUTION_FUNCTION) is fla_causal_conv1d_fn


def test_the_causal_conv1d_package_keeps_the_short_convolutions(
    hybrid_model: torch.nn.Module, modeling: ModuleType, install: Callable
) -> None:
    transformers_own = getattr(modeling, SHORT_CONVOLUTION_FUNCTION)
    install("causal_conv1d")
    assert settle_linear_attention(hybrid_model, "fla", "auto", CUDA) == "fla"
    assert getattr(modeling, SHORT_CONVOLUTION_FUNCTION) is transformers_own


def test_queries_and_keys_are_scaled_as_fla_scales_them() -> None:
    """FLA's L2 norm: x / sqrt(sum(x^2) + 1e-6) in float32, in the input's dtype; the
    layer's strided views come back contiguous."""
    mixed = torch.randn(2, 5, 3 * 2 * 16, generator=torch.Generator().manual_seed(0))
    mixed[0, 0, :16] = 1e-3  # a short query head: the epsilon shows
    query, key, value = (p.reshape(2, 5, 2, 16) for p in mixed.bfloat16().split(32, -1))
    assert not query.is_contiguous()
    out = normalized_qkv(query, key, value)
    for got, given in zip(out[:2], (query, key), strict=True):
        wide = given.float()
        expected = (wide / torch.sqrt((wide * wide).sum(-1, keepdim=True) + 1e-6)).bfloat16()
        assert got.dtype == torch.bfloat16 and got.is_contiguous()
        torch.testing.assert_close(got, expected, atol=0, rtol=0)
    assert out[0][0, 0, 0, 0].item() == pytest.approx(1e-3 / (16e-6 + 1e-6) ** 0.5, rel=1e-2)
    assert out[2].is_contiguous() and torch.equal(out[2], value)


def test_queries_and_keys_are_prepared_only_where_the_layer_asks() -> None:
    seen: list[tuple] = []

    def chunk_rule(query, key, value, *args, use_qk_l2norm_in_kernel: bool, **kwargs):
        seen.append((query, key, value, args, use_qk_l2norm_in_kernel, kwargs))
        return "out"

    prepared = (torch.zeros(1), torch.ones(1), torch.full((1,), 2.0))
    run = with_normalized_qk(chunk_rule, lambda query, key, value: prepared)
    given = (torch.full((1,), 3.0), torch.full((1,), 4.0), torch.full((1,), 5.0))
    assert run(*given, "g", beta=0.5) == "out"
    assert run(*given, "g", beta=0.5, use_qk_l2norm_in_kernel=True) == "out"
    assert [call[:3] for call in seen] == [given, prepared]
    assert [call[3:] for call in seen] == [(("g",), False, {"beta": 0.5})] * 2
