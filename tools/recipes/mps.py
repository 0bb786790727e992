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


@contextmanager
def mps_daemon(wanted: bool) -> Iterator[bool]:
    """Run the MPS daemon for the ``with`` block when ``wanted``; yields whether it runs.
    A daemon started here is stopped at the end; one that was running already is left."""
    if not wanted:
        yield False
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
    try:
        yield True
    finally:
        subprocess.run([CONTROL], input="quit\n", capture_output=True, text=True)
