"""Where a step's GPU time goes: the top kernels of a few profiled steps (torch.profiler).

Used by the benchmarks' `--profile` option: ``top_kernels(step, steps=3)`` runs `step`
under the profiler and returns the kernels with the most device time per step, each as
``{"kernel", "ms_per_step", "calls_per_step", "share"}`` (share of all device time),
then an ``"all kernels"`` row (their sum: compare it with the step's wall time to see
idle gaps) and an ``"other"`` row for the kernels below the top. ``print_top`` prints
them as a short table. Without CUDA the ranking uses the operators' own CPU time (a
smoke run).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile


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


def print_top(title: str, ranked: list[dict]) -> None:
    """The ranked kernels as a table (ms per step, calls per step, share)."""
    print(f"--- {title}: device time per step by kernel")
    for row in ranked:
        print(
            f"{row['ms_per_step']:>9.3f} ms {row['calls_per_step']:>7.1f}x "
            f"{100 * row['share']:>5.1f}%  {row['kernel']}"
        )
