"""The persistent compile caches under run.cache_dir: one folder per role and local rank,
so concurrent ranks on a node never write the same cache files; Triton's autotune
results are kept there; what the user set in the environment wins."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import pytest
import torch

from ringtrain.config import parse_config
from ringtrain.main import set_compile_caches
from ringtrain.trainer.roles import RankInfo

CACHE_VARIABLES = ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_AUTOTUNING")
# A node of one target and two drafters: (local rank, role).
RANKS = ((0, "target"), (1, "drafter"), (2, "drafter"))


def caches_of_rank(cache_dir: str, local_rank: int, role: str) -> dict[str, str]:
    """In a fresh process (as each torchrun rank is): the cache settings it ends up with."""
    config = parse_config(f"[run]\ncache_dir = {cache_dir!r}\n")
    info = RankInfo(local_rank, 3, local_rank, 3, 0, 1, 0, role, 0, 1, 1, 2, torch.device("cpu"))
    set_compile_caches(config, info)
    return {name: os.environ[name] for name in CACHE_VARIABLES}


def caches_of_node(cache_dir: Path) -> list[dict[str, str]]:
    context = multiprocessing.get_context("spawn")
    with context.Pool(len(RANKS)) as pool:
        return pool.starmap(caches_of_rank, [(str(cache_dir), *rank) for rank in RANKS])


@pytest.fixture
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in CACHE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_each_rank_of_a_node_gets_its_own_persistent_caches_with_autotune_results_kept(
    tmp_path: Path, clean_environment: pytest.MonkeyPatch
) -> None:
    caches = caches_of_node(tmp_path / "cache")

    folders = [Path(rank["TRITON_CACHE_DIR"]).parent for rank in caches]
    assert [folder.name for folder in folders] == ["target0", "drafter1", "drafter2"]
    assert all(folder.parent == tmp_path / "cache" for folder in folders)
    every_dir = [rank[name] for rank in caches for name in CACHE_VARIABLES[:2]]
    assert len(set(every_dir)) == len(every_dir)  # no two ranks (or caches) share a folder
    assert all(rank["TRITON_CACHE_AUTOTUNING"] == "1" for rank in caches)


def test_cache_settings_the_user_made_win(
    tmp_path: Path, clean_environment: pytest.MonkeyPatch
) -> None:
    clean_environment.setenv("TRITON_CACHE_AUTOTUNING", "0")
    clean_environment.setenv("TRITON_CACHE_DIR", str(tmp_path / "own-triton"))

    caches = caches_of_node(tmp_path / "cache")

    assert all(rank["TRITON_CACHE_AUTOTUNING"] == "0" for rank in caches)
    assert all(rank["TRITON_CACHE_DIR"] == str(tmp_path / "own-triton") for rank in caches)
    assert len({rank["TORCHINDUCTOR_CACHE_DIR"] for rank in caches}) == len(RANKS)
