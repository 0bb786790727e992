"""The CUDA MPS daemon around a step whose processes share one GPU.

Without MPS, processes on one GPU are time-sliced: each holds the whole GPU for its
slice, however small its kernels. Under the MPS daemon their kernels run side by side,
which is what many small evaluation processes of a small target need. The daemon comes
with the NVIDIA driver (``nvidia-cuda-mps-control``); where it is missing, already
running or not startable, the step runs as it is and says so.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

CONTROL = "nvidia-cuda-mps-control"
# How deep this process is inside a daemon it started (0: none): a step inside another
# runs under the outer daemon, so no daemon is stopped and started again between steps.
_depth = 0


@contextmanager
def mps_daemon(wanted: bool) -> Iterator[bool]:
    """Run the MPS daemon for the ``with`` block when ``wanted``; yields whether it runs.
    A daemon started here is stopped at the end; one that was running already is left,
    and a block inside another's keeps the outer daemon."""
    global _depth
    if not wanted:
        yield False
        return
    if _depth:
        _depth += 1
        try:
            yield True
        finally:
            _depth -= 1
        return
    if shutil.which(CONTROL) is None:
        print(f"[mps] {CONTROL} not found: processes share the GPU time-sliced", file=sys.stderr)
        yield False
        return
    start = subprocess.run([CONTROL, "-d"], capture_output=True, text=True)
    if start.returncode != 0:
        reason = (start.stderr or start.stdout).strip() or f"exit {start.returncode}"
        print(f"[mps] daemon not started here ({reason}): running without", file=sys.stderr)
        yield False
        return
    _depth = 1
    try:
        yield True
    finally:
        _depth = 0
        subprocess.run([CONTROL], input="quit\n", capture_output=True, text=True)
