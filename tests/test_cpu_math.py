"""The CPU's vector math settled at a process's start (ringtrain/cpu_math.py).

A fresh process's first cos on two threads may run a low-accuracy kernel on one thread's
chunk; after `settle_cpu_math` it may not. The race shows in about a third of the fresh
processes of an idle 2-core machine (fewer on a busy one), so a handful of settled
processes, each checked against float64, catch a settling that no longer settles cos;
and the settling calls each function on one element (one thread) in both precisions.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ringtrain.cpu_math import VECTOR_MATH, settle_cpu_math

ROOT = Path(__file__).resolve().parents[1]


def test_settled_fresh_processes_compute_their_first_cos_accurately() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tools.bench.bench_cpu_math", "--processes", "4"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["processes_each"] == 4
    assert report["first_cos_wrong_settled"] == 0
    assert report["largest_miss_settled"] < 1e-6


def test_settling_calls_every_vector_math_function_in_both_precisions(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    called: list[tuple[str, torch.dtype, int]] = []

    def spy(function):
        return lambda x: called.append((function.__name__, x.dtype, x.numel()))

    monkeypatch.setattr("ringtrain.cpu_math.VECTOR_MATH", tuple(map(spy, VECTOR_MATH)))
    settle_cpu_math.cache_clear()
    try:
        settle_cpu_math()
        settle_cpu_math()  # once per process
    finally:
        settle_cpu_math.cache_clear()
    names = [f.__name__ for f in VECTOR_MATH]
    assert called == [(n, d, 1) for d in (torch.float32, torch.float64) for n in names]
    assert {"cos", "sin", "exp", "log", "sqrt", "tanh"} <= set(names)
