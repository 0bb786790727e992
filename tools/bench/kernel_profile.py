"""Where a step's GPU time goes: the top kernels of a few profiled steps (torch.profiler).

Used by the benchmarks' `--profile` option: ``top_kernels(step, steps=3)`` runs `step`
under the profiler and returns the kernels with the most device time per step, each as
``{"kernel", "ms_per_step", "calls_per_step", "share"}`` (share of all device time),
then an ``"all kernels"`` row (their sum: compare it with the step's wall time to see
idle gaps) and an ``"other"`` row for the kernels below the top. ``print_top`` prints
them as a short table. ``kernel_diff`` compares two such profiles kernel by kernel, with
Inductor's numbering of its generated kernels taken off their names (the same fused
kernel is ``..._4`` in one compiled graph and ``..._5`` in another), so what one variant
runs more of than the other shows. Without CUDA the ranking uses the operators' own CPU
time (a smoke run).
"""

from __future__ import annotations

import re
from collections.abc import Callable

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

# The two summary rows of top_kernels, not kernels.
SUMMARY_ROWS = ("all kernels", "other")


def top_kernels(step: Callable[[], object], steps: int = 3, top: int = 25) -> list[dict]:
    """Profile `steps` calls of `step` (synchronised) and rank kernels by device time."""
    cuda = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    own_time = "self_device_time_total" if cuda else "self_cpu_time_total"
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        if cuda:
            torch.cuda.synchronize()
    rows = []
    for event in prof.key_averages():
        micros = getattr(event, own_time, 0.0)
        # On CUDA keep the kernels and copies themselves (operators also carry their
        # kernels' time), and not the profiler's launch-queue-full marker.
        kernel = not cuda or (
            event.device_type == DeviceType.CUDA and event.key != "Command Buffer Full"
        )
        if micros > 0 and kernel:
            rows.append((micros, event.count, event.key))
    rows.sort(reverse=True)
    total = sum(us for us, _, _ in rows) or 1.0
    ranked = [
        {
            "kernel": key[:90],
            "ms_per_step": round(us / 1e3 / steps, 3),
            "calls_per_step": round(count / steps, 1),
            "share": round(us / total, 4),
        }
        for us, count, key in rows[:top]
    ]
    rest = sum(us for us, _, _ in rows[top:])
    ranked.append(
        {
            "kernel": "all kernels",
            "ms_per_step": round(total / 1e3 / steps, 3),
            "calls_per_step": round(sum(c for _, c, _ in rows) / steps, 1),
            "share": 1.0,
        }
    )
    ranked.append(
        {
            "kernel": "other",
            "ms_per_step": round(rest / 1e3 / steps, 3),
            "calls_per_step": round(sum(c for _, c, _ in rows[top:]) / steps, 1),
            "share": round(rest / total, 4),
        }
    )
    return ranked


def print_top(title: str, ranked: list[dict], rows: int = 25) -> None:
    """The first `rows` ranked kernels and the two summary rows as a table (ms per step,
    calls per step, share)."""
    print(f"--- {title}: device time per step by kernel")
    kernels = [row for row in ranked if row["kernel"] not in SUMMARY_ROWS]
    for row in kernels[:rows] + [row for row in ranked if row["kernel"] in SUMMARY_ROWS]:
        print(
            f"{row['ms_per_step']:>9.3f} ms {row['calls_per_step']:>7.1f}x "
            f"{100 * row['share']:>5.1f}%  {row['kernel']}"
        )


def _by_kernel(ranked: list[dict]) -> dict[str, tuple[float, float]]:
    """ms and calls per step by kernel name, Inductor's trailing kernel number taken off."""
    grouped: dict[str, tuple[float, float]] = {}
    for row in ranked:
        if row["kernel"] in SUMMARY_ROWS:
            continue
        name = re.sub(r"_\d+$", "", row["kernel"])
        ms, calls = grouped.get(name, (0.0, 0.0))
        grouped[name] = (ms + row["ms_per_step"], calls + row["calls_per_step"])
    return grouped


def kernel_diff(base: list[dict], other: list[dict]) -> list[dict]:
    """What `other` runs beyond `base` (two top_kernels profiles), per kernel name: rows
    ``{"kernel", "extra_ms", "base_ms", "other_ms", "base_calls", "other_calls"}``, the
    largest extra time first (negative: kernels `other` runs less of)."""
    ours, theirs = _by_kernel(base), _by_kernel(other)
    rows = []
    for name in ours.keys() | theirs.keys():
        base_ms, base_calls = ours.get(name, (0.0, 0.0))
        other_ms, other_calls = theirs.get(name, (0.0, 0.0))
        rows.append(
            {"kernel": name, "extra_ms": round(other_ms - base_ms, 3), "base_ms": base_ms,
             "other_ms": other_ms, "base_calls": base_calls, "other_calls": other_calls}
        )  # fmt: skip
    return sorted(rows, key=lambda row: -row["extra_ms"])


def print_diff(title: str, diff: list[dict], rows: int = 30) -> None:
    """The kernels of largest extra time (kernel_diff) as a short table."""
    print(f"--- {title}: extra device time per step by kernel")
    for row in diff[:rows]:
        print(
            f"{row['extra_ms']:>+9.3f} ms {row['base_ms']:>8.3f} -> {row['other_ms']:>8.3f} ms "
            f"{row['base_calls']:>6.1f} -> {row['other_calls']:>6.1f}x  {row['kernel']}"
        )
