"""How long a rank took to reach its first log line, and the one slow cause it can name.

Before a rank's first log line lies only the launch and the imports (torch, transformers,
the model code). Where Python may not write bytecode (PYTHONDONTWRITEBYTECODE, common in
container images) and the installed packages hold none (installers that skip compiling
them), every start compiles those sources again: 10-15 s a rank instead of 2-4. The first
log line says how long the rank took, and a second names that cause when it applies.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import ModuleType

from ringtrain.ring.liveness import CLOCK_TICKS_PER_S, process_start_time

# A start this slow (seconds) is worth a word about bytecode when Python writes none.
SLOW_START_S = 8.0


def process_age_s() -> float | None:
    """Seconds since this process started (Linux's /proc), None where that is unknown."""
    started_ticks = process_start_time(os.getpid())
    try:
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return None if started_ticks < 0 else uptime - started_ticks / CLOCK_TICKS_PER_S


def compiles_sources_at_each_start(module: ModuleType) -> bool:
    """Whether Python compiled `module` from source and may not keep the result."""
    cached = getattr(module, "__cached__", None)
    return sys.dont_write_bytecode and not (cached is not None and Path(cached).exists())


def started_in(age_s: float | None) -> str:
    """The first log line's tail: how long this rank took to get there."""
    return "" if age_s is None else f"; started in {age_s:.1f} s (its imports)"


def bytecode_advice(age_s: float | None, imported: ModuleType) -> str | None:
    """What to change when a slow start came from Python compiling `imported`'s (and
    every other package's) sources again, as it does at each start; None otherwise."""
    if age_s is None or age_s < SLOW_START_S or not compiles_sources_at_each_start(imported):
        return None
    return (
        f"Python writes no bytecode here (PYTHONDONTWRITEBYTECODE is set) and "
        f"{imported.__name__}'s installation holds none, so every start compiles the "
        f"packages' sources again; unset PYTHONDONTWRITEBYTECODE, or set "
        f"PYTHONPYCACHEPREFIX to a writable folder, and later starts skip that"
    )
