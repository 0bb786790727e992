"""The persistent compile caches under ``run.cache_dir``, what they make a compile cost,
and how many graphs this process has compiled.

Compiled graphs and kernels (Inductor), Triton's kernels and autotune results live below
``run.cache_dir`` so that later starts skip what earlier ones compiled and tuned.
"""

from __future__ import annotations

import os
from pathlib import Path

from ringtrain.config import Config

# Inductor's folder of compiled FX graphs inside its cache directory.
FX_GRAPHS = "fxgraph"


def set_compile_caches(config: Config) -> None:
    """Point Triton and Inductor at the persistent caches under ``run.cache_dir``.

    One set of caches serves every rank and run: Inductor and Triton write each entry to
    a temporary file of their own and rename it into place, so ranks compiling at once
    leave whole entries (two that compile the same graph write the same entry twice),
    and what one rank, one run or one layout compiled the next reuses. Persistence means
    a warm restart skips compilation and autotuning: FLA keeps its kernels' autotune
    results in Triton's cache (its own default), so a warm start skips the Gated DeltaNet
    autotune (43 s cold, 0.4 s warm on an H200), and TRITON_CACHE_AUTOTUNING keeps those
    of any other autotuned Triton kernel there too (Triton reads it when a kernel is
    defined, before the model is built). A value the user set in the environment wins."""
    root = Path(config.run.cache_dir).expanduser()
    os.environ.setdefault("TRITON_CACHE_DIR", str(root / "triton"))
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(root / "inductor"))
    os.environ.setdefault("TRITON_CACHE_AUTOTUNING", "1")


def expected_compile_time() -> str:
    """What the next compilation should cost, for the log line that announces it: seconds
    where Inductor's cache already holds compiled graphs (an earlier run of these models
    left them), else a minute or so."""
    directory = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    graphs = Path(directory) / FX_GRAPHS if directory else None
    if graphs is not None and graphs.is_dir() and any(graphs.iterdir()):
        return f"seconds where {directory} holds these graphs from an earlier run"
    return "a minute or so with empty caches"


def compiled_graph_count() -> int:
    """Graphs compiled so far in this process (a rise after warm-up means a recompile)."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])
