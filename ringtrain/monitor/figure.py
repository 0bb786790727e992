"""One picture of a run (matplotlib, Agg backend): what ringtrain-plot draws.

Six panels over the training step: loss and tau (evaluations marked), tokens/s, the ring
(occupancy, and the share of time targets waited on drafters and drafters on targets),
GPU busy per rank, and accuracy per block position. Restarts (resumed sessions) are
dashed lines on every step axis. A figure the run did not record (ring counters in runs
written before they were recorded, GPU busy on CPU) leaves its panel with a note saying so.
"""

from __future__ import annotations

import itertools
import math
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes

from ringtrain.monitor.ring_figures import figures_of_record, intervals, role_mean
from ringtrain.monitor.runlog import RunLog

EVAL_COLOUR = "tab:red"


def _smooth(values: np.ndarray) -> np.ndarray:
    """Running mean over about a twentieth of the points (same length as `values`)."""
    window = max(1, len(values) // 20)
    if window == 1:
        return values
    padded = np.concatenate([np.full(window - 1, values[0]), values])
    return np.convolve(padded, np.ones(window) / window, mode="valid")


# Records written before a figure was renamed carry it under its old name.
_OLD_NAMES = {"tau_uniform": "tau"}


def _series(run: RunLog, key: str) -> tuple[np.ndarray, np.ndarray]:
    steps = np.array([r["step"] for r in run.steps], dtype=float)
    old = _OLD_NAMES.get(key, key)
    values = [r[key] if key in r else r[old] for r in run.steps]
    # A skipped step's non-finite loss is null in JSON: plotted as a gap.
    return steps, np.array([math.nan if v is None else float(v) for v in values])


def _note(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="grey")


def _train_and_eval(ax: Axes, run: RunLog, key: str, eval_key: str, label: str) -> None:
    steps, values = _series(run, key)
    ax.plot(steps, values, color="tab:blue", alpha=0.3, lw=0.8)
    ax.plot(steps, _smooth(values), color="tab:blue", label=label)
    if run.evals:
        ax.plot(
            [e["step"] for e in run.evals],
            [e[eval_key] for e in run.evals],
            "o-",
            color=EVAL_COLOUR,
            label=f"held-out {eval_key}",
        )
    ax.legend(fontsize="small")


def _throughput(ax: Axes, run: RunLog) -> None:
    steps, tokens = _series(run, "tokens")
    seconds = np.array([max(float(r["seconds"]), 1e-9) for r in run.steps])
    rate = tokens / seconds
    ax.plot(steps, rate, color="tab:green", alpha=0.3, lw=0.8)
    ax.plot(steps, _smooth(rate), color="tab:green")
    ax.set_ylabel("tokens/s")
    ax.set_ylim(bottom=0)


def _ring(ax: Axes, run: RunLog) -> None:
    readings = [
        (r["step"], r["ring"]["occupancy"], figures)
        for r in run.steps
        if (figures := figures_of_record(r)) is not None
    ]
    if not readings:
        _note(ax, "no ring counters in these records")
        return
    ax.plot([s for s, _, _ in readings], [100 * o for _, o, _ in readings], label="ring occupied")
    waits: dict[str, list[tuple[int, float]]] = {"target": [], "drafter": []}
    for (_, _, before), (step, _, after) in itertools.pairwise(readings):
        ranks = intervals(before, after)
        for role, points in waits.items():
            share = role_mean(ranks, role, "wait_share")
            if share is not None:
                points.append((step, 100 * share))
    for role, label in (
        ("target", "targets wait (ring full)"),
        ("drafter", "drafters wait (ring empty)"),
    ):
        if waits[role]:
            steps, values = zip(*waits[role], strict=True)
            ax.plot(steps, _smooth(np.array(values)), label=label)
    ax.set_ylabel("% of time")
    ax.set_ylim(0, 105)
    ax.legend(fontsize="small")


def _gpu_busy(ax: Axes, run: RunLog) -> None:
    by_rank: dict[str, list[tuple[int, float]]] = {}
    for record in run.steps:
        for rank, busy in (record.get("gpu_busy_by_rank") or {}).items():
            by_rank.setdefault(str(rank), []).append((record["step"], 100 * float(busy)))
    if not by_rank:
        _note(ax, "no GPU busy figures (CPU run, or NVML not installed)")
        return
    for rank, points in sorted(by_rank.items(), key=lambda item: int(item[0])):
        steps, values = zip(*points, strict=True)
        ax.plot(steps, values, label=f"rank {rank}")
    ax.set_ylabel("GPU busy %")
    ax.set_ylim(0, 105)
    ax.legend(fontsize="small", ncol=2)


def _accuracy_per_position(ax: Axes, run: RunLog) -> None:
    last = run.steps[-1]
    positions = np.arange(1, len(last["accuracy"]) + 1)
    ax.plot(positions, last["accuracy"], "o-", label=f"training, step {last['step']}")
    if run.evals:
        final = run.evals[-1]
        ax.plot(
            positions,
            final["accuracy_per_slot"],
            "o-",
            color=EVAL_COLOUR,
            label=f"held-out, step {final['step']}",
        )
    ax.set_xlabel("block position")
    ax.set_ylabel("accuracy")
    ax.set_ylim(0, 1)
    ax.legend(fontsize="small")


def _title(run: RunLog) -> str:
    last = run.steps[-1]
    parts = [f"{run.name}: step {last['step']}"]
    if run.evals:
        parts.append(f"{len(run.evals)} evaluations (tau_sim {run.evals[-1]['tau_sim']:.2f})")
    if run.restarts:
        parts.append(f"resumed at step {', '.join(map(str, run.restarts))}")
    age = time.time() - float(last.get("wall", time.time()))
    if age >= 0:
        parts.append(f"last step {age:,.0f} s ago")
    return " | ".join(parts)


def render(run: RunLog, output: Path, dpi: int = 80) -> Path:
    """Draw `run` into the PNG file `output`; returns its path."""
    fig, axes = plt.subplots(3, 2, figsize=(13, 10), constrained_layout=True)
    (loss, tau), (rate, ring), (busy, accuracy) = axes
    _train_and_eval(loss, run, "loss", "loss", "training loss")
    _train_and_eval(tau, run, "tau_uniform", "tau_sim", "tau_uniform (training, uniform anchors)")
    _throughput(rate, run)
    _ring(ring, run)
    _gpu_busy(busy, run)
    _accuracy_per_position(accuracy, run)
    titles = ["loss", "acceptance length", "throughput", "ring: who waits on whom", "GPU busy"]
    first, last = run.steps[0]["step"], run.steps[-1]["step"]
    for ax, title in zip((loss, tau, rate, ring, busy), titles, strict=True):
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.set_xlim(first - 0.5, last + 0.5)
        for index, step in enumerate(run.restarts):
            ax.axvline(step, color="grey", ls="--", lw=1, label=None if index else "resumed")
        ax.grid(alpha=0.3)
    if run.restarts:
        loss.legend(fontsize="small")
    accuracy.set_title("accuracy per block position")
    accuracy.grid(alpha=0.3)
    fig.suptitle(_title(run))
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output, dpi=dpi)
    plt.close(fig)
    return output
