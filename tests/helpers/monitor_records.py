"""Helpers of the monitor tests: synthetic metrics records shaped like the lead drafter's,
the lead drafter's in-memory step records, and TensorBoard scalars read back with
TensorBoard's own reader."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ringtrain.trainer.step_record import StepRecord

BLOCK_POSITIONS = 7
WALL0 = 1_800_000_000.0


def step_record(step: int, ring: bool = True, gpu: bool = True) -> dict[str, Any]:
    """Step `step` of a 2-target, 1-drafter run: loss falling, ring counters growing."""
    record: dict[str, Any] = {
        "event": "step",
        "step": step,
        "loss": 6.0 / step,
        "accuracy": [0.1 * step / (k + 1) for k in range(BLOCK_POSITIONS)],
        "tau_uniform": 1.0 + 0.05 * step,
        "tokens": 1000 + step,
        "seconds": 0.5,
        "lr": 1e-3,
        "batches": [[step % 2, step // 2, step]],
        "wall": WALL0 + step,
        "compiles": 3,
        "gpu_busy": 0.9 if gpu else None,
        "gpu_busy_by_rank": {"0": 0.5, "1": 0.6, "2": 0.9} if gpu else {},
    }
    if ring:
        # Each target blocks 0.25 s per second, the drafter starves 0.1 s per second.
        record["ring"] = {
            "occupancy": 0.5,
            "ranks": [
                [0, "target", 0, step, float(step), 0.25 * step],
                [1, "target", 1, step, float(step), 0.25 * step],
                [2, "drafter", 2, 2 * step, float(step), 0.1 * step],
            ],
        }
    return record


def eval_record(step: int, round_id: int) -> dict[str, Any]:
    """A held-out evaluation after step `step`."""
    return {
        "event": "eval",
        "step": step,
        "loss": 5.0 / step,
        "weight_sum": 10.0,
        "accuracy": 0.2,
        "accuracy_per_slot": [0.3 / (k + 1) for k in range(BLOCK_POSITIONS)],
        "tau_uniform": 1.5,
        "blocks": 40.0,
        "scored_labels": 200.0,
        "tau_sim": 1.2 + 0.1 * round_id,
        "replay_tokens": 100.0,
        "replay_steps": 80.0,
        "round": round_id,
    }


def write_run(run_dir: Path, records: list[dict[str, Any]], tail: str = "") -> Path:
    """A run directory with config.json and these records in metrics.jsonl (+ raw `tail`)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps({"run": {"name": "synthetic"}}))
    lines = "".join(json.dumps(record) + "\n" for record in records)
    (run_dir / "metrics.jsonl").write_text(lines + tail)
    return run_dir


def tensorboard_scalars(log_dir: Path) -> dict[str, dict[int, float]]:
    """Every scalar under `log_dir` as {tag: {step: value}} (needs the tensorboard extra)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    reader = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    reader.Reload()
    return {
        tag: {event.step: event.value for event in reader.Scalars(tag)}
        for tag in reader.Tags()["scalars"]
    }


def lead_step(step: int, tokens: int, seconds: float) -> StepRecord:
    """The lead drafter's record of training step `step` (its batch: producer 0's
    step - 1), with the token count and seconds the test needs."""
    return StepRecord(
        step=step,
        loss=2.0,
        accuracy=[0.5],
        tau_uniform=1.5,
        tokens=tokens,
        seconds=seconds,
        lr=1e-3,
        batches=[[0, step - 1, step - 1]],
        wall=0.0,
        compiles=0,
        gpu_busy=None,
        gpu_busy_by_rank={},
    )
