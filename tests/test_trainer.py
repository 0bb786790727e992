"""End-to-end training runs through torchrun on CPU (real processes, real ring)."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
from pathlib import Path

import pytest
import torch

from ringtrain.checkpoint import latest_checkpoint, load_checkpoint
from tests.helpers.launcher import (
    RUN_TIMEOUT_S,
    eval_records,
    expected_batch_ids,
    run_training,
    shm_entries,
    start_training,
    step_records,
    trained_batches,
    wait_for_step,
    worker_pid,
)

pytestmark = pytest.mark.slow


def _assert_ok(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _warnings(run_dir: Path) -> list[str]:
    """Warning and error lines of every rank's log: a successful run ends quietly."""
    return [
        line
        for log in sorted((run_dir / "logs").glob("*.log"))
        for line in log.read_text().splitlines()
        if " WARNING " in line or " ERROR " in line
    ]


def test_two_targets_one_drafter_learn_and_checkpoint(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = run_training(
        run_dir,
        2,
        1,
        ["run.max_steps=30", "run.checkpoint_every=10", "run.eval_every=15", "run.name=t2d1"],
    )
    _assert_ok(proc)
    records = step_records(run_dir)
    assert [r["step"] for r in records] == list(range(1, 31))
    losses = [r["loss"] for r in records]
    # Which producer's batch comes next depends on timing, so the curve differs run to
    # run (last/first ten-step means 0.70-0.75 over 50 steps, 0.71 over 30; once 0.81 over
    # five steps under load).
    assert _mean(losses[-10:]) < 0.9 * _mean(losses[:10])
    batches = trained_batches(records)
    assert len(set(batches)) == len(batches) == 30
    evals = eval_records(run_dir)
    assert [e["round"] for e in evals] == [1, 2]
    assert all(1.0 <= e["tau_sim"] <= 8.0 for e in evals)
    assert evals[-1]["loss"] < evals[0]["loss"]
    assert {producer for producer, _, _ in batches} == {0, 1}
    for rank, role in [(0, "target"), (1, "target"), (2, "drafter")]:
        assert (run_dir / "logs" / f"rank{rank}-{role}.log").stat().st_size > 0
    assert "done: 30 steps" in proc.stdout
    checkpoint = latest_checkpoint(run_dir / "checkpoints")
    assert checkpoint is not None and checkpoint.name.endswith("30")
    mid = sorted((run_dir / "checkpoints").glob("*10"))
    assert mid, "the step-10 checkpoint is kept"
    loaded = load_checkpoint(mid[0], "cpu")
    assert loaded.step == 10
    assert shm_entries("t2d1") == []
    assert _warnings(run_dir) == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_clean_run_over_device_slabs_ends_quietly(tmp_path: Path) -> None:
    """The target frees its GPU slab at the end while unread items are still in the ring:
    the drafters closing cleanly is the normal end, not a fault to warn about."""
    run_dir = tmp_path / "run"
    overrides = ['run.device="cuda"', 'ring.transport="device"', "run.max_steps=8"]
    overrides += ["run.eval_every=0", "drafter.compile=false", 'target.compile="off"']
    _assert_ok(run_training(run_dir, 1, 1, [*overrides, "run.name=quiet"]))
    assert "transport device" in (run_dir / "logs" / "rank0-target.log").read_text()
    assert _warnings(run_dir) == []


def test_two_targets_two_drafters_share_gradients_and_evaluate(tmp_path: Path) -> None:
    """Two drafters under DDP: every step trains one batch each, held-out rounds (run
    through the DDP module without gradients, in uneven numbers per drafter) complete,
    and the checkpoint holds the plain module's parameter names."""
    run_dir = tmp_path / "run"
    overrides = ["run.max_steps=12", "run.eval_every=6", "run.checkpoint_every=6", "run.name=t2d2"]
    proc = run_training(run_dir, 2, 2, overrides)
    _assert_ok(proc)
    records = step_records(run_dir)
    assert [r["step"] for r in records] == list(range(1, 13))
    assert all(len(r["batches"]) == 2 for r in records)
    batches = trained_batches(records)
    assert len(set(batches)) == len(batches) == 24
    assert {producer for producer, _, _ in batches} == {0, 1}
    assert [e["round"] for e in eval_records(run_dir)] == [1, 2]
    checkpoint = latest_checkpoint(run_dir / "checkpoints")
    assert checkpoint is not None and load_checkpoint(checkpoint, "cpu").step == 12
    names = load_checkpoint(checkpoint, "cpu").model.state_dict()
    assert "fc.weight" in names and not any(name.startswith("module.") for name in names)
    assert _warnings(run_dir) == []


def test_a_kill_and_a_sigterm_resume_to_the_stream_and_every_evaluation_round_once(
    tmp_path: Path,
) -> None:
    """Round k is evaluated after step k * eval_every and reported so, a run whose
    max_steps is no multiple of eval_every gets a last round after it (and a last
    checkpoint, the newest of the two kept). A SIGKILL then a
    resume from the last checkpoint, then a SIGTERM to the whole launch (which checkpoints
    the step it stopped at) and a second resume train the target's stream batch by batch as
    an unbroken run would, and leave every round in metrics.jsonl exactly once: the round
    due at the resumed step (which completes steps after its checkpoint) runs again."""
    run_dir = tmp_path / "run"
    overrides = ["run.max_steps=18", "run.eval_every=4", "run.checkpoint_every=4"]
    overrides += ["run.keep_checkpoints=2", "run.log_every=1", "run.name=evalresume"]
    proc = start_training(run_dir, 1, 1, overrides)
    wait_for_step(proc, run_dir, 5)
    for local_rank in (0, 1):  # the workers outlive a killed torchrun: kill them first
        os.kill(worker_pid(proc.pid, local_rank), signal.SIGKILL)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=RUN_TIMEOUT_S)
    checkpoint = latest_checkpoint(run_dir / "checkpoints")
    assert checkpoint is not None and load_checkpoint(checkpoint, "cpu").step < 18

    proc = start_training(run_dir, 1, 1, overrides, resume=True)
    wait_for_step(proc, run_dir, 10)
    os.killpg(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
    stopped = step_records(run_dir)[-1]["step"]
    assert 10 <= stopped < 18, out[-3000:]
    checkpoint = latest_checkpoint(run_dir / "checkpoints")
    assert checkpoint is not None
    assert load_checkpoint(checkpoint, "cpu").step == stopped, out[-3000:]

    resumed = run_training(run_dir, 1, 1, overrides, resume=True)
    _assert_ok(resumed)
    records = step_records(run_dir)
    assert [r["step"] for r in records] == list(range(1, 19))
    stream = expected_batch_ids(run_dir, 1, {0: 18})[0]
    assert trained_batches(records) == [(0, seq, stream[seq]) for seq in range(18)]
    evals = [(e["round"], e["step"]) for e in eval_records(run_dir)]
    assert evals == [(1, 4), (2, 8), (3, 12), (4, 16), (5, 18)]
    assert "eval round 5 after step 18 |" in resumed.stdout
    assert shm_entries("evalresume") == []
    # run.keep_checkpoints: only the newest two are kept, over all three sessions, and every
    # file of a checkpoint has the same mode.
    root = run_dir / "checkpoints"
    assert sorted(p.name for p in root.iterdir()) == ["step_00000016", "step_00000018"]
    assert load_checkpoint(root, "cpu", weights=False).step == 18
    umask = os.umask(0)
    os.umask(umask)
    for checkpoint in root.iterdir():
        modes = {stat.S_IMODE(file.stat().st_mode) for file in checkpoint.iterdir()}
        assert modes == {0o666 & ~umask}, checkpoint
