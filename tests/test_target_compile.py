"""Compiled target layers on CPU: equal to eager, every unit compiled, no steady-state
recompiles."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from torch._inductor.compile_fx import compile_fx
from transformers import CONFIG_MAPPING
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeDecoderLayer

from ringtrain.compile_caches import compiled_graph_count
from ringtrain.config import ConfigError, parse_config
from ringtrain.target.compiled import compile_units, resolve_compile
from ringtrain.target.loader import load_target
from ringtrain.target.tapped import TappedTarget
from ringtrain.target.tiny import build_tiny_target
from tests.helpers.tiny_families import build_model, write_model

TAPS = [1, 3, 6]
# Warm-up shapes (rows, length): several rows, one row, and a length equal to the head
# size (16), which duck sizing would unify with it and specialise.
WARM_UP = ((3, 40), (1, 16), (2, 100))
FURTHER = ((4, 33), (1, 57), (5, 8), (2, 128))


class CountingInductor:
    """The Inductor backend, counting graphs compiled and compiled-graph runs."""

    def __init__(self) -> None:
        self.graphs = 0
        self.runs = 0

    def __call__(self, graph: torch.fx.GraphModule, example_inputs: list) -> Callable:
        self.graphs += 1
        compiled = compile_fx(graph, example_inputs)

        def run(*args: object) -> object:
            self.runs += 1
            return compiled(*args)

        return run


@pytest.fixture
def fresh_dynamo() -> Iterator[None]:
    """Empty Dynamo caches: each test counts its own graphs against the recompile limit."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def taps(target: TappedTarget, rows: int, length: int) -> torch.Tensor:
    """The taps of every token of a full random [rows, length] batch."""
    generator = torch.Generator().manual_seed(1000 * rows + length)
    input_ids = torch.randint(0, target.vocab_size, (rows, length), generator=generator)
    out = torch.full((rows * length, target.tap_width), float("nan"))
    target.forward_into(input_ids, torch.arange(rows * length), out)
    return out


def eager_and_compiled(
    tmp_path: Path, seed: int, hybrid: bool
) -> tuple[TappedTarget, TappedTarget, CountingInductor]:
    """Two loads of one tiny target: eager, and with layers compiled by a counting backend."""
    path = build_tiny_target(tmp_path, seed=seed, hybrid=hybrid)
    eager = load_target(path, tap_layers=TAPS, compile="off")
    compiled = load_target(path, tap_layers=TAPS, compile="off")
    backend = CountingInductor()
    compiled.compile_layers(backend)
    return eager, compiled, backend


def test_dense_layers_compile_whole_once_and_match_eager(
    tmp_path: Path, fresh_dynamo: None, caplog: pytest.LogCaptureFixture
) -> None:
    eager, compiled, backend = eager_and_compiled(tmp_path, seed=5, hybrid=False)
    layers = len(compiled.module.layers)
    assert compiled.compiled_units == [str(i) for i in range(layers)]

    with caplog.at_level(logging.INFO, logger="ringtrain.target.tapped"):
        compiled.precompile(length=24)
    assert re.search(r"target layers compiled in [\d.]+ s: 2 graphs", caplog.text)
    # All layers share one code object: one graph for several rows, one for a single row.
    assert backend.graphs == 2
    _assert_whole_layers_match_eager(compiled, eager, backend, graphs=2)


def _assert_whole_layers_match_eager(
    compiled: TappedTarget, eager: TappedTarget, backend: CountingInductor, graphs: int
) -> None:
    """Compiled taps equal eager ones at the warm-up shapes and further ones, every layer
    runs as one compiled unit at each further shape, and no shape adds a graph past
    ``graphs``."""
    layers = len(compiled.module.layers)
    for shape in WARM_UP:
        torch.testing.assert_close(taps(compiled, *shape), taps(eager, *shape))
    assert backend.graphs == graphs
    for shape in FURTHER:
        runs = backend.runs
        torch.testing.assert_close(taps(compiled, *shape), taps(eager, *shape))
        assert backend.runs - runs == layers, f"a layer ran eagerly or in pieces at {shape}"
    assert backend.graphs == graphs


def test_load_target_compiles_before_the_first_batch(tmp_path: Path, fresh_dynamo: None) -> None:
    path = build_tiny_target(tmp_path, seed=5, hybrid=False)
    before = compiled_graph_count()
    target = load_target(path, tap_layers=TAPS, compile="on")
    assert compiled_graph_count() - before == 2
    for shape in FURTHER:
        taps(target, *shape)
    assert compiled_graph_count() - before == 2


def test_hybrid_compiles_attention_layers_whole_and_linear_layers_in_parts(
    tmp_path: Path, fresh_dynamo: None
) -> None:
    eager, compiled, backend = eager_and_compiled(tmp_path, seed=6, hybrid=True)
    parts = ("input_layernorm", "post_attention_layernorm", "mlp", "linear_attn.norm")
    expected_units = [
        str(i) if layer_type == "full_attention" else f"{i}.{part}"
        for i, layer_type in enumerate(compiled.module.config.layer_types)
        for part in ([""] if layer_type == "full_attention" else parts)
    ]
    assert (
        "3" in expected_units
        and "0.mlp" in expected_units
        and "0.linear_attn.norm" in expected_units
    )
    assert compiled.compiled_units == expected_units

    for shape in ((3, 40), (2, 100)):
        runs = backend.runs
        torch.testing.assert_close(taps(compiled, *shape), taps(eager, *shape))
        assert backend.runs - runs == len(expected_units)
    graphs = backend.graphs
    torch.testing.assert_close(taps(compiled, 4, 33), taps(eager, 4, 33))
    assert backend.graphs == graphs


def test_mixture_of_experts_blocks_stay_eager_unless_compile_moe() -> None:
    config = CONFIG_MAPPING["qwen3_moe"](
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=16,
        num_experts=4,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        num_hidden_layers=2,
        mlp_only_layers=[1],
    )
    config._experts_implementation = "grouped_mm"
    routed, dense = (Qwen3MoeDecoderLayer(config, i) for i in range(2))
    assert compile_units(routed) == ["input_layernorm", "post_attention_layernorm", "self_attn"]
    assert compile_units(dense) == [""]
    assert compile_units(routed, moe=True) == [""]
    # The experts loop over the experts a batch hit (data-dependent shapes): stays eager.
    config._experts_implementation = "eager"
    assert compile_units(routed, moe=True) == [
        "input_layernorm",
        "post_attention_layernorm",
        "self_attn",
    ]


def test_compile_moe_compiles_routed_layers_whole_once_and_matches_eager(
    tmp_path: Path, fresh_dynamo: None
) -> None:
    path = write_model(tmp_path / "qwen3_moe", build_model("qwen3_moe", seed=3))
    eager = load_target(path, num_taps=3, compile="off")
    compiled = load_target(path, num_taps=3, compile="off")
    assert eager.module.config._experts_implementation == "grouped_mm"
    backend = CountingInductor()
    compiled.compile_layers(backend, moe=True)
    layers = len(compiled.module.layers)
    assert compiled.compiled_units == [str(i) for i in range(layers)]

    # Dense layer 0 and the routed layers: a graph each for several rows and for one row.
    _assert_whole_layers_match_eager(compiled, eager, backend, graphs=4)


def test_compile_setting() -> None:
    assert resolve_compile("auto", torch.device("cuda")) is True
    assert resolve_compile("auto", torch.device("cpu")) is False
    assert resolve_compile("on", torch.device("cpu")) is True
    assert resolve_compile("off", torch.device("cuda")) is False
    with pytest.raises(
        ValueError, match=r"target\.compile 'yes' is not one of 'auto', 'on', 'off'"
    ):
        resolve_compile("yes", torch.device("cpu"))
    assert parse_config('[target]\ncompile = "on"').target.compile == "on"
    with pytest.raises(ConfigError, match=r"Invalid enum value 'yes' - at `\$\.target\.compile`"):
        parse_config('[target]\ncompile = "yes"')


def test_compile_twice_is_refused(tmp_path: Path) -> None:
    target = load_target(build_tiny_target(tmp_path, hybrid=False, num_layers=4), num_taps=1)
    target.compile_layers()
    with pytest.raises(RuntimeError, match=r"already compiled; compile them once"):
        target.compile_layers()
