"""The CPU's vector math, made to choose its kernels before several threads use it.

On the CPU, torch computes float32 and float64 cos, sin, exp, log, sqrt, tanh, erf and
the other functions of `VECTOR_MATH` with oneMKL's vector math library, which chooses
each function's kernel when that function is first called in a process. Where that
first call runs on several intra-op threads at once (a process's first sizable cos, such
as the drafter's RoPE table), one thread may compute its chunk of it with a
low-accuracy kernel: errors of about 1e-4 where the accurate kernel's are 1e-7. The
process's first forward then differs from every later one, and two runs of the same
step differ. On a 2-core CPU, the first cos of a [512, 8] RoPE table came out so in 14
to 27 of 100 fresh processes, and in none after `settle_cpu_math`
(`python -m tools.bench.bench_cpu_math`).

`settle_cpu_math` calls each of these functions once, on one element (so on one thread),
before the process computes anything: every later call finds its kernel chosen.
"""

from __future__ import annotations

import functools

import torch

# The functions torch hands to oneMKL's vector math for float32 and float64 tensors.
VECTOR_MATH = (
    torch.acos,
    torch.asin,
    torch.atan,
    torch.cos,
    torch.erf,
    torch.erfc,
    torch.erfinv,
    torch.exp,
    torch.log,
    torch.log10,
    torch.log2,
    torch.sin,
    torch.sqrt,
    torch.tan,
    torch.tanh,
    torch.trunc,
)


@functools.cache
def settle_cpu_math() -> None:
    """Call every function of `VECTOR_MATH` once on one float32 and one float64 element
    (once per process; a few microseconds)."""
    for dtype in (torch.float32, torch.float64):
        one = torch.full((1,), 0.5, dtype=dtype)
        for function in VECTOR_MATH:
            function(one)
