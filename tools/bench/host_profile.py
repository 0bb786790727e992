"""Host-side profile of a benchmark loop, for the scripts in tools/bench/:
the loop's most expensive functions by own time, per item it handled."""

from __future__ import annotations

import cProfile
import io
import pstats
from collections.abc import Callable


def profiled(top: int, loop: Callable[..., dict], *args) -> dict:
    """Run `loop(*args)`; with top > 0 under cProfile, adding its `top` functions by own
    time (calls and microseconds per item) to the result as `profile`. Items are the
    result's `produced` count or the length of its `seen` list."""
    if top <= 0:
        return loop(*args)
    profiler = cProfile.Profile()
    result = profiler.runcall(loop, *args)
    items = max(result.get("produced", 0), len(result.get("seen", [])), 1)
    stats = pstats.Stats(profiler, stream=io.StringIO())
    rows = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)[:top]
    result["profile"] = [
        {
            "function": pstats.func_std_string(func),
            "calls_per_item": round(calls / items, 2),
            "us_per_item": round(own / items * 1e6, 1),
        }
        for func, (_, calls, own, _, _) in rows
    ]
    return result
