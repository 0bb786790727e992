"""The persistent compile caches under run.cache_dir: one set shared by every rank of a
node and by later runs (ranks that compile at once leave whole entries, and a restart
reuses them); Triton's autotune results are kept there; what the user set in the
environment wins."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from ringtrain.compile_caches import expected_compile_time, set_compile_caches
from ringtrain.config import parse_config

CACHE_VARIABLES = ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_AUTOTUNING")
# Ranks of a node that compile at once.
RANKS = 2


def cache_settings(cache_dir: Path) -> dict[str, str]:
    """The cache settings a rank ends up with."""
    set_compile_caches(parse_config(f"[run]\ncache_dir = {str(cache_dir)!r}\n"))
    return {name: os.environ[name] for name in CACHE_VARIABLES}


def scaled_sums(x: torch.Tensor) -> torch.Tensor:
    """A graph Inductor compiles into one fused kernel: elementwise work and a reduction."""
    return (x.sin() * 2.0 + x.cos()).sum(-1)


def compile_as_rank(cache_dir: str, start: Any) -> dict[str, Any]:
    """In a fresh process: take the run's caches, wait until every rank is ready, then
    compile and run `scaled_sums`; its result and the FX-graph cache's hits and misses."""
    set_compile_caches(parse_config(f"[run]\ncache_dir = {cache_dir!r}\n"))
    from torch._dynamo.utils import counters

    x = torch.linspace(-3.0, 3.0, 4 * 33).view(4, 33)
    if start is not None:
        start.wait()
    result = torch.compile(scaled_sums, backend="inductor")(x)
    return {
        "equal": torch.allclose(result, scaled_sums(x), rtol=1e-5, atol=1e-5),
        "hits": counters["inductor"]["fxgraph_cache_hit"],
        "misses": counters["inductor"]["fxgraph_cache_miss"],
    }


@pytest.fixture
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in CACHE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_the_caches_live_under_cache_dir_with_autotune_results_kept(
    tmp_path: Path, clean_environment: pytest.MonkeyPatch
) -> None:
    assert cache_settings(tmp_path / "cache") == {
        "TRITON_CACHE_DIR": str(tmp_path / "cache" / "triton"),
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache" / "inductor"),
        "TRITON_CACHE_AUTOTUNING": "1",
    }


def test_ranks_compiling_at_once_into_the_shared_cache_leave_entries_a_restart_reuses(
    tmp_path: Path, clean_environment: pytest.MonkeyPatch
) -> None:
    cache_dir = str(tmp_path / "cache")
    context = multiprocessing.get_context("spawn")
    start = context.Manager().Barrier(RANKS)
    with context.Pool(RANKS) as pool:
        concurrent = pool.starmap(compile_as_rank, [(cache_dir, start)] * RANKS)
    with context.Pool(1) as pool:
        (restart,) = pool.starmap(compile_as_rank, [(cache_dir, None)])

    assert all(rank["equal"] for rank in concurrent)
    assert all(rank["misses"] + rank["hits"] >= 1 for rank in concurrent)
    assert restart == {"equal": True, "hits": 1, "misses": 0}
    leftovers = [path.name for path in (tmp_path / "cache").rglob("*") if path.suffix == ".tmp"]
    assert not leftovers, f"partly written cache entries left behind: {leftovers}"


def test_cache_settings_the_user_made_win(
    tmp_path: Path, clean_environment: pytest.MonkeyPatch
) -> None:
    clean_environment.setenv("TRITON_CACHE_AUTOTUNING", "0")
    clean_environment.setenv("TRITON_CACHE_DIR", str(tmp_path / "own-triton"))

    assert cache_settings(tmp_path / "cache") == {
        "TRITON_CACHE_DIR": str(tmp_path / "own-triton"),
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache" / "inductor"),
        "TRITON_CACHE_AUTOTUNING": "0",
    }


def test_the_announced_compile_time_follows_what_the_cache_holds(
    tmp_path: Path, clean_environment: pytest.MonkeyPatch
) -> None:
    cache_settings(tmp_path / "cache")
    assert expected_compile_time() == "a minute or so with empty caches"
    graphs = tmp_path / "cache" / "inductor" / "fxgraph"
    graphs.mkdir(parents=True)
    assert expected_compile_time() == "a minute or so with empty caches"
    (graphs / "an-entry").mkdir()
    assert expected_compile_time().startswith(f"seconds where {tmp_path / 'cache' / 'inductor'}")
