"""GPU time of a repeated call, the chip's peak the benchmarks' MFU is a fraction of, and
the refusal of a CUDA-only benchmark without a GPU, for the benchmark scripts in
tools/bench/."""

from __future__ import annotations

from collections.abc import Callable

import torch

# Dense bf16 FLOP/s of the H200, the GPU these benchmarks were written for: every MFU in
# tools/bench/ divides by it.
PEAK_BF16_FLOPS = 989e12


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


def require_cuda(benchmark: str) -> None:
    """Exit with a message naming ``benchmark`` where no CUDA GPU is present."""
    if not torch.cuda.is_available():
        raise SystemExit(f"{benchmark} needs a CUDA GPU")
