"""A real CPU run with report_to = ["tensorboard"]: plotted while it trains and after it
stopped; its TensorBoard scalars, read back with TensorBoard's own reader, match
metrics.jsonl; the summary gives the role-split advice."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from ringtrain.cli.plot import main as plot_main
from ringtrain.monitor.runlog import RunDirError, read_run
from tests.helpers.launcher import RUN_TIMEOUT_S, eval_records, start_training, step_records
from tests.helpers.monitor_records import tensorboard_scalars

pytestmark = pytest.mark.slow
pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed")
pytest.importorskip("matplotlib", reason="the plot extra is not installed")
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _plot(run_dir: Path, output: Path) -> None:
    assert plot_main([str(run_dir), "-o", str(output)]) == 0
    assert read_run(run_dir).malformed == []  # the trainer's records have what is plotted
    assert output.read_bytes().startswith(PNG_MAGIC)


def _wait_until_evaluated(run_dir: Path, proc: subprocess.Popen[str]) -> None:
    """Poll metrics.jsonl until a few steps and one evaluation round are recorded."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the run ended before it was plotted"
        try:
            run = read_run(run_dir)
            if len(run.steps) >= 3 and run.evals:
                return
        except RunDirError:
            pass  # not started yet
        time.sleep(0.2)
    raise AssertionError("no evaluation recorded in time")


def test_a_run_reporting_to_tensorboard_plotted_live_and_finished(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    overrides = [
        "run.max_steps=400",  # stopped long before: it is live while plotted
        "run.eval_every=2",
        "run.checkpoint_every=0",
        'run.report_to=["tensorboard"]',
        "run.name=plotted",
    ]
    proc = start_training(run_dir, 1, 1, overrides)
    try:
        _wait_until_evaluated(run_dir, proc)
        _plot(run_dir, tmp_path / "live.png")
        assert proc.poll() is None, "the run was plotted while it trained"
        os.killpg(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    steps, evals = step_records(run_dir), eval_records(run_dir)
    assert len(steps) >= 3 and evals, out[-3000:]
    scalars = tensorboard_scalars(run_dir / "tensorboard")
    approx = pytest.approx
    assert scalars["train/loss"] == approx({r["step"]: r["loss"] for r in steps})
    assert scalars["train/accuracy/pos1"] == approx({r["step"]: r["accuracy"][0] for r in steps})
    assert scalars["eval/tau_sim"] == approx({e["step"]: e["tau_sim"] for e in evals})
    assert scalars["eval/loss"] == approx({e["step"]: e["loss"] for e in evals})
    assert scalars["ring/occupancy"] == approx({r["step"]: r["ring"]["occupancy"] for r in steps})
    assert set(scalars["ring/drafters_starved_pct"]) == {r["step"] for r in steps[1:]}
    assert "role split over the node's 2 processes" in out, out[-3000:]
    _plot(run_dir, tmp_path / "finished.png")
