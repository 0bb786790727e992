"""tools/bench/gpu_gaps: a step's idle device time, put on the code that was launching."""

from __future__ import annotations

import pytest

from tools.bench.gpu_gaps import MIN_GAP_US, idle_report


def _frame(name: str, ts: float, dur: float, tid: int = 1) -> dict:
    return {"cat": "python_function", "name": name, "ts": ts, "dur": dur, "tid": tid}


def _launch(correlation: int, ts: float, tid: int = 1) -> dict:
    return {
        "cat": "cuda_runtime",
        "ts": ts,
        "dur": 1,
        "tid": tid,
        "args": {"correlation": correlation},
    }


def _kernel(correlation: int, ts: float, dur: float) -> dict:
    return {"cat": "kernel", "ts": ts, "dur": dur, "args": {"correlation": correlation}}


def test_idle_time_is_put_on_the_frames_that_launched_the_kernel_waited_for() -> None:
    """Two steps: a kernel, then a wait for one launched from the mask builder, then one
    launched from a library with no project frame, overlapping kernels counted once."""
    events = [
        _frame("/x/ringtrain/drafter/block_step.py(10): step", 0, 1000),
        _frame("/x/ringtrain/drafter/masks.py(20): build", 100, 300),
        _frame("/x/ringtrain/drafter/masks.py(30): _block_mask", 150, 200),
        _launch(1, 50),
        _kernel(1, 60, 100),  # busy 60..160
        _kernel(5, 120, 60),  # overlaps: busy to 180
        _launch(2, 300),  # inside _block_mask
        _kernel(2, 400, 100),  # gap 180 -> 400 on the mask builder
        _launch(3, 1500, tid=2),  # no frame open on its thread
        _kernel(3, 1600, 10),  # gap 500 -> 1600 outside the project
        _kernel(4, 1610 + MIN_GAP_US / 2, 10),  # a gap below MIN_GAP_US: spacing
    ]
    report = idle_report(events, steps=2)
    span = 1610 + MIN_GAP_US / 2 + 10 - 60  # idle, but no source
    busy = 120 + 100 + 10 + 10
    assert report["span_ms"] == pytest.approx(span / 1e3 / 2, abs=1e-3)
    assert report["busy_ms"] == pytest.approx(busy / 1e3 / 2, abs=1e-3)
    assert report["idle_share"] == pytest.approx((span - busy) / span, abs=1e-4)
    assert report["sources"] == [
        {"where": "(outside)", "idle_ms": 0.55, "gaps": 0.5},
        {
            "where": "ringtrain/drafter/masks.py(20): build > "
            "ringtrain/drafter/masks.py(30): _block_mask",
            "idle_ms": 0.11,
            "gaps": 0.5,
        },
    ]


def test_a_trace_without_device_work_reports_nothing() -> None:
    report = idle_report([_frame("ringtrain/a.py(1): f", 0, 10)], steps=1)
    assert report["busy_ms"] == report["idle_ms"] == 0.0 and report["sources"] == []
