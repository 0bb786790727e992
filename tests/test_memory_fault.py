"""A rank that runs out of memory ends the run with one line that says where, what the
rank's memory scales with and what to lower: unit checks of the line, and a drafter of a
real run under the launcher whose step fails to allocate (ringtrain.testing.OOM_HOOK)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch

from ringtrain.testing import OOM_HOOK
from ringtrain.trainer.memory_fault import is_out_of_memory, out_of_memory_message
from ringtrain.trainer.roles import RankInfo
from tests.helpers.launcher import (
    finish_launch,
    rank_row,
    run_env,
    shm_entries,
    start_launch,
    tiny_config,
    wait_for_step,
)

CUDA_WORDS = "CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total capacity of 79 GiB"


def _info(role: str) -> RankInfo:
    return RankInfo(0, 2, 0, 2, 0, 1, 0, role, 0, 1, 1, 1, torch.device("cpu"))


def test_out_of_memory_is_told_from_other_errors() -> None:
    assert is_out_of_memory(torch.OutOfMemoryError(CUDA_WORDS))
    host = (
        "[enforce fail] DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 bytes"
    )
    assert is_out_of_memory(RuntimeError(host))
    assert not is_out_of_memory(RuntimeError("shape mismatch"))
    assert not is_out_of_memory(ValueError("DefaultCPUAllocator: can't allocate memory"))


@pytest.mark.parametrize(
    ("role", "settings"),
    [
        ("drafter", ["drafter.num_anchors = 64", "drafter.loss_chunk = 512", "Lower drafter."]),
        ("target", ["ring.slots_per_producer = 2", "Lower ring.", "(layout.target_tp)"]),
    ],
)
def test_the_line_names_the_allocation_the_settings_of_the_role_and_the_fix(
    role: str, settings: list[str]
) -> None:
    settings_given = ["drafter.num_anchors=64", "drafter.loss_chunk=512", "data.token_budget=1024"]
    config = tiny_config([*settings_given, "ring.slots_per_producer=2"])
    line = out_of_memory_message(torch.OutOfMemoryError(CUDA_WORDS), _info(role), config)
    assert line.startswith(f"rank0-{role}0 ran out of memory allocating 1.50 GiB in host memory.")
    assert "data.token_budget = 1024" in line, line
    # What a resume keeps comes first; the budget, which changes the batches, last.
    assert line.index("(--resume goes on") < line.index("or lower data.token_budget"), line
    assert line.endswith("a fresh start (--resume refuses it)"), line
    for setting in settings:
        assert setting in line, line


@pytest.mark.slow
def test_a_drafter_out_of_memory_ends_the_run_with_what_to_lower(tmp_path: Path) -> None:
    """The drafter's next step fails to allocate: the launcher's last line is the drafter's
    own, with the settings and the fix, and nothing is left in /dev/shm."""
    name = f"oom{os.getpid()}"
    run_dir = tmp_path / "run"
    overrides = ["run.max_steps=1000", "run.eval_every=0", "run.checkpoint_every=0"]
    env = run_env()
    env["PYTHONPATH"] = os.pathsep.join([str(OOM_HOOK), env.get("PYTHONPATH", "")])
    env["RINGTRAIN_FAIL_ALLOCATION_IN"] = "block_objective"
    proc, output = start_launch(run_dir, 1, 1, [*overrides, f'run.name="{name}"'], env=env)
    try:
        wait_for_step(proc, run_dir, 1, output.read_text)
        os.kill(rank_row(name, 1).pid, signal.SIGUSR1)
    finally:
        text = finish_launch(proc, output)
    assert proc.returncode == 1, text[-4000:]
    assert "Traceback" not in text, text[-4000:]
    last = [line for line in text.splitlines() if line.startswith("ringtrain: ")][-1]
    assert "rank1-drafter0 ran out of memory allocating 2.00 GiB in host memory" in last, last
    assert "drafter.loss_chunk = " in last and "drafter.num_anchors = " in last, last
    assert last.endswith(f"(its log: {run_dir / 'logs' / 'rank1-drafter.log'})"), last
    assert "Traceback" in (run_dir / "logs" / "rank1-drafter.log").read_text()
    assert shm_entries(name) == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_on_a_shared_gpu_the_line_says_how_full_it_is_and_offers_a_gpu_of_its_own() -> None:
    info = RankInfo(
        1, 2, 1, 2, 0, 1, 0, "drafter", 0, 1, 1, 1, torch.device("cuda", 0), local_gpus=(0, 0)
    )
    line = out_of_memory_message(torch.OutOfMemoryError(CUDA_WORDS), info, tiny_config([]))
    assert "allocating 1.50 GiB on GPU cuda:0 (" in line and " GiB free, " in line, line
    assert "2 ranks of this node run on it" in line and "(layout.gpu_map)" in line, line
