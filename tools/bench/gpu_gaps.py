"""Where a step leaves the GPU idle: the gaps between its kernels, by the code that was
launching the kernel the GPU waited for.

Used by the benchmarks' `--gaps` option. ``idle_gaps(step, steps=2)`` runs `step` under
torch.profiler with Python stacks (CUDA only) and hands the trace to ``idle_report``,
which walks the device's kernels, copies and memsets in time order: the span from the
first to the end of the last, the time some of them ran (busy) and the rest (idle), per
step. Each gap of at least ``MIN_GAP_US`` is put on the innermost frames of this project
(``ringtrain/``, ``tools/``) that were running on the launching thread when the kernel
after the gap was launched: what the GPU was waiting for. A gap whose launch ran outside
any project frame (inside a library's own loop, or a compiled graph's runner called from
it) is put on the nearest project frames around it all the same; "(outside)" means none.
``print_gaps`` prints the report as a short table.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

# Gaps shorter than this are the launch queue's own spacing, not waiting.
MIN_GAP_US = 20.0
DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH_CATEGORIES = ("cuda_runtime", "cuda_driver")
PROJECT_MARKERS = ("ringtrain/", "tools/")
# Project frames named per gap source, innermost last.
FRAMES_PER_SOURCE = 2


def _short(frame: str) -> str:
    """A frame's name from the project's root on
    ("/x/ringtrain/a.py(3): f" -> "ringtrain/a.py(3): f")."""
    for marker in PROJECT_MARKERS:
        at = frame.find(marker)
        if at >= 0:
            return frame[at:]
    return frame


def _launch_frames(events: list[dict], launches: dict[int, dict]) -> dict[int, str]:
    """For each launch (by correlation id), the innermost project frames open on its
    thread when it ran, as "outer > inner" (a sweep over the nested Python frames)."""
    frames = sorted(
        (e for e in events if e.get("cat") == "python_function" and "dur" in e),
        key=lambda e: e["ts"],
    )
    queries = sorted(launches.items(), key=lambda item: item[1]["ts"])
    stacks: dict[object, list[dict]] = {}
    where: dict[int, str] = {}
    next_frame = 0
    for correlation, launch in queries:
        at = launch["ts"]
        while next_frame < len(frames) and frames[next_frame]["ts"] <= at:
            frame = frames[next_frame]
            stack = stacks.setdefault(frame.get("tid"), [])
            while stack and stack[-1]["ts"] + stack[-1]["dur"] < frame["ts"]:
                stack.pop()
            stack.append(frame)
            next_frame += 1
        stack = stacks.get(launch.get("tid"), [])
        while stack and stack[-1]["ts"] + stack[-1]["dur"] < at:
            stack.pop()
        own = [_short(f["name"]) for f in stack if any(m in f["name"] for m in PROJECT_MARKERS)]
        where[correlation] = " > ".join(own[-FRAMES_PER_SOURCE:]) or "(outside)"
    return where


def idle_report(events: Iterable[dict], steps: int, top: int = 12) -> dict:
    """Busy and idle device time per step of a chrome trace's events, and the largest
    sources of idle time (see the module docstring)."""
    events = list(events)
    device = sorted(
        (e for e in events if e.get("cat") in DEVICE_CATEGORIES and "dur" in e),
        key=lambda e: e["ts"],
    )
    if not device:
        return {"span_ms": 0.0, "busy_ms": 0.0, "idle_ms": 0.0, "idle_share": 0.0, "sources": []}
    busy, covered_to = 0.0, device[0]["ts"]
    gaps: list[tuple[float, dict]] = []
    for event in device:
        start, end = event["ts"], event["ts"] + event["dur"]
        if start - covered_to >= MIN_GAP_US:
            gaps.append((start - covered_to, event))
        busy += max(0.0, end - max(start, covered_to))
        covered_to = max(covered_to, end)
    span = covered_to - device[0]["ts"]
    correlation_of = [event.get("args", {}).get("correlation") for _, event in gaps]
    launches = {
        e["args"]["correlation"]: e
        for e in events
        if e.get("cat") in LAUNCH_CATEGORIES and e.get("args", {}).get("correlation") is not None
    }
    where = _launch_frames(events, {c: launches[c] for c in correlation_of if c in launches})
    sources: dict[str, list[float]] = {}
    for (gap, _), correlation in zip(gaps, correlation_of, strict=True):
        entry = sources.setdefault(where.get(correlation, "(no launch found)"), [0.0, 0])
        entry[0] += gap
        entry[1] += 1
    ranked = sorted(sources.items(), key=lambda item: item[1][0], reverse=True)[:top]
    return {
        "span_ms": round(span / 1e3 / steps, 3),
        "busy_ms": round(busy / 1e3 / steps, 3),
        "idle_ms": round((span - busy) / 1e3 / steps, 3),
        "idle_share": round((span - busy) / span, 4) if span else 0.0,
        "sources": [
            {"where": name, "idle_ms": round(us / 1e3 / steps, 3), "gaps": count / steps}
            for name, (us, count) in ranked
        ],
    }


def idle_gaps(step: Callable[[], object], steps: int = 2, top: int = 12) -> dict:
    """Profile `steps` calls of `step` (CUDA) and report its idle gaps (`idle_report`)."""
    if not torch.cuda.is_available():
        raise RuntimeError("idle gaps are measured on a CUDA GPU; this machine has none")
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=True) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory(prefix="gpu-gaps-") as folder:
        path = Path(folder) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text())["traceEvents"]
    return idle_report(events, steps, top)


def print_gaps(title: str, report: dict) -> None:
    """The report as a table: busy and idle ms per step, then the idle time by source."""
    print(
        f"--- {title}: per step {report['span_ms']:.1f} ms of device span, "
        f"{report['busy_ms']:.1f} busy, {report['idle_ms']:.1f} idle "
        f"({100 * report['idle_share']:.1f}%)"
    )
    for row in report["sources"]:
        print(f"{row['idle_ms']:>9.3f} ms {row['gaps']:>6.1f} gaps  {row['where']}")
