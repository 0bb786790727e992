"""GPU time of a repeated call, for the benchmark scripts in tools/bench/."""

from __future__ import annotations

from collections.abc import Callable

import torch


def gpu_us_per_call(call: Callable[[int], object], reps: int) -> float:
    """Mean GPU microseconds of `call(k)` for k = 0..reps-1, queued back to back on the
    current stream between two timing events, after one untimed `call(0)`."""
    call(0)
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for k in range(reps):
        call(k)
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) * 1e3 / reps
