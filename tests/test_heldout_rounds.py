"""A held-out round is reported in the step after the one it is due after, scored with
that step's weights: an exact resume across the round gives the identical figures."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from ringtrain.checkpoint import latest_checkpoint, load_checkpoint
from tests.helpers.launcher import (
    RUN_TIMEOUT_S,
    run_training,
    start_training,
    wait_for_step,
    worker_pid,
)

OVERRIDES = [
    "run.max_steps=8",
    "run.eval_every=4",
    "run.checkpoint_every=4",
    "run.log_every=1",
    "run.name=heldround",
]
SCORES = ("tau_sim", "loss", "accuracy", "tau_uniform", "replay_tokens", "replay_steps")


def _events(path: Path) -> list[dict]:
    records = [json.loads(line) for line in path.read_text().splitlines()]
    return [r for r in records if r["event"] in ("step", "eval")]


@pytest.mark.slow
def test_a_round_comes_in_the_next_step_and_an_exact_resume_scores_it_alike(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "run"
    proc = start_training(run_dir, 1, 1, OVERRIDES)
    wait_for_step(proc, run_dir, 5)
    for local_rank in (0, 1):  # the workers outlive a killed torchrun: kill them first
        os.kill(worker_pid(proc.pid, local_rank), signal.SIGKILL)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=RUN_TIMEOUT_S)
    checkpoint = latest_checkpoint(run_dir / "checkpoints")
    assert checkpoint is not None and load_checkpoint(checkpoint, "cpu", weights=False).step == 4

    # Round 1, due after step 4 (as its checkpoint was written), came during step 5.
    first = _events(run_dir / "metrics.jsonl")
    order = [(r["event"], r["step"]) for r in first]
    assert order[:6] == [("step", s) for s in range(1, 5)] + [("eval", 4), ("step", 5)]

    resumed = run_training(run_dir, 1, 1, OVERRIDES, resume=True)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    again = _events(run_dir / "metrics.jsonl")
    order = [(r["event"], r["step"]) for r in again]
    assert order == [
        *[("step", s) for s in range(1, 5)],
        ("eval", 4),
        *[("step", s) for s in range(5, 9)],
        ("eval", 8),
    ]
    before = next(r for r in first if r["event"] == "eval")
    after = next(r for r in again if r["event"] == "eval")
    assert {k: after[k] for k in SCORES} == {k: before[k] for k in SCORES}
