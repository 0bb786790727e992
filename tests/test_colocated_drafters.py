"""Drafter ranks that share a GPU: the drafter group's backend follows the device map.

NCCL refuses two ranks of one communicator on one GPU, so drafters that share a GPU
reduce through a gloo group (said in one line), and drafters on distinct GPUs keep NCCL.
The CPU tests read the choice from the torchrun environment with CUDA's device count
stood in; the GPU test runs the embedded default (1 target + 2 drafters) on one GPU.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ringtrain.config import ConfigError, LayoutConfig
from ringtrain.trainer.groups import drafter_backend
from ringtrain.trainer.roles import RankInfo, rank_info_from_env
from tests.helpers.launcher import RUN_TIMEOUT_S, as_torchrun_rank, run_env


def rank_info(
    monkeypatch: pytest.MonkeyPatch, gpus: int, layout: LayoutConfig, local_rank: int = 0
) -> RankInfo:
    """The RankInfo torchrun's environment gives local rank `local_rank` of one node on a
    machine with `gpus` GPUs (0: a CPU machine)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    per_node = layout.targets_per_node + layout.drafters_per_node
    as_torchrun_rank(monkeypatch, local_rank, local_rank, per_node, per_node)
    return rank_info_from_env(layout, "auto")


@pytest.mark.parametrize(
    ("gpus", "gpu_map", "backend"),
    [
        (1, [], "gloo"),  # the embedded default on one GPU: both drafters on cuda:0
        (2, [], "nccl"),  # drafters on cuda:1 and cuda:0
        (8, [], "nccl"),
        (2, [0, 0, 1], "nccl"),  # the target shares a GPU with a drafter: not in one group
        (2, [0, 1, 1], "gloo"),
    ],
)
def test_drafters_sharing_a_gpu_reduce_with_gloo_and_others_with_nccl(
    monkeypatch: pytest.MonkeyPatch, gpus: int, gpu_map: list[int], backend: str
) -> None:
    layout = LayoutConfig(targets_per_node=1, drafters_per_node=2, gpu_map=gpu_map)
    for local_rank in range(3):  # every rank makes the same choice
        choice = drafter_backend(rank_info(monkeypatch, gpus, layout, local_rank))
        assert choice.name == backend
        assert (choice.note is not None) == (backend == "gloo")
    if backend == "gloo":
        assert choice.note is not None and "2 on cuda:" in choice.note


def test_cpu_drafters_reduce_with_gloo_without_a_note(monkeypatch: pytest.MonkeyPatch) -> None:
    layout = LayoutConfig(targets_per_node=1, drafters_per_node=3)
    info = rank_info(monkeypatch, 0, layout, local_rank=2)
    assert info.local_gpus == ()
    choice = drafter_backend(info)
    assert (choice.name, choice.note) == ("gloo", None)


def test_a_gpu_map_may_name_the_last_gpu_and_no_further(monkeypatch: pytest.MonkeyPatch) -> None:
    layout = LayoutConfig(targets_per_node=1, drafters_per_node=2, gpu_map=[0, 1, 1])
    assert rank_info(monkeypatch, 2, layout, local_rank=2).local_gpus == (0, 1, 1)
    beyond = LayoutConfig(targets_per_node=1, drafters_per_node=2, gpu_map=[0, 1, 2])
    with pytest.raises(ConfigError, match=r"layout.gpu_map\[2\] = 2 but this node has 2 GPU"):
        rank_info(monkeypatch, 2, beyond)


def test_drafter_ranks_count_over_nodes_after_each_node_s_targets(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two nodes of 1 target + 3 drafters: rank 7 is node 1's last drafter, drafter 5."""
    as_torchrun_rank(monkeypatch, rank=7, local_rank=3, world_size=8, local_world_size=4)
    layout = LayoutConfig(targets_per_node=1, drafters_per_node=3)
    info = rank_info_from_env(layout, "cpu")
    assert (info.role, info.role_index, info.role_count) == ("drafter", 5, 6)
    assert info.drafter_ranks == [1, 2, 3, 5, 6, 7]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_embedded_default_trains_three_processes_on_one_gpu(tmp_path: Path) -> None:
    """`torchrun --nproc-per-node 3 -m ringtrain.main` on one GPU (the first visible):
    1 target + 2 drafters on cuda:0 train to the end and report a held-out tau_sim."""
    env = run_env()
    visible = env.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]
    env["CUDA_VISIBLE_DEVICES"] = visible
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node=3", "-m", "ringtrain.main"]
    command += ["--set", f'run.run_dir="{tmp_path / "run"}"']
    proc = subprocess.run(
        command,
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    assert "drafter ranks share a GPU (2 on cuda:0)" in output
    assert any("eval round" in line and "tau_sim" in line for line in output.splitlines())
    assert os.path.isdir(tmp_path / "run" / "checkpoints")
