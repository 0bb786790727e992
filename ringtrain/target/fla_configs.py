"""Tuned configurations of flash-linear-attention's kernels, shipped per GPU.

FLA's Triton kernels for Gated DeltaNet layers autotune on their first call: 43 s for
``chunk_gated_delta_rule`` on an H200 with empty caches, the largest share of a hybrid
target's first step on a fresh machine (the persistent Triton cache under
``run.cache_dir`` only helps the second start). FLA can take a kernel's configuration
from a directory of JSON files instead (``FLA_CONFIG_DIR``: one ``<kernel>.json`` per
kernel, entries keyed by the kernel's autotune key), looked up as ``FLA_CACHE_MODE``
says: "fuzzy" takes the entry with the same key, else one whose key has the same
structure and dtypes whatever its sizes, and autotunes where none fits.

ringtrain ships such a directory for each GPU it has tuned on (``fla_configs/<GPU>/``,
the GPU's name as FLA spells folders: runs of other characters than letters and digits
become one ``_``), written by ``python -m tools.bench.fla_configs`` on that GPU with the
FLA release named in its ``versions.json`` (kernels' tunable parameters change between
releases, so another release autotunes as before). FLA reads both variables once, when
it is imported, so `use_shipped_fla_configs` runs before a hybrid target's modeling code
imports it. A user's own ``FLA_CONFIG_DIR`` or ``FLA_CACHE_MODE`` wins; a GPU without a
shipped directory autotunes as before.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os
import re
import sys
from pathlib import Path

import torch

log = logging.getLogger(__name__)

SHIPPED_FLA_CONFIGS = Path(__file__).parent / "fla_configs"
# An exact key first, then one of the same structure and dtypes; autotune where none fits.
FLA_CACHE_MODE = "fuzzy"
# The distribution whose kernels were tuned, recorded in each folder's versions.json.
FLA_DISTRIBUTION = "fla-core"
VERSIONS_FILE = "versions.json"
# What an autotuning first forward costs, for the log line that announces it.
AUTOTUNE_WAIT = (
    "about 40 s on an H200 with empty caches, seconds where the Triton cache under "
    "run.cache_dir holds their results from an earlier run"
)


def log_autotune(reason: str, *args: object) -> None:
    """Say that FLA's kernels will autotune at the first forward, what that costs, and
    why (``reason``, a format string for ``args``)."""
    log.info(
        "FLA kernels autotune at the target's first forward (%s): " + reason,
        AUTOTUNE_WAIT, *args,
    )  # fmt: skip


def gpu_folder(gpu_name: str) -> str:
    """A GPU's name as FLA names its per-GPU configuration folders."""
    return re.sub(r"[^0-9A-Za-z]+", "_", gpu_name).strip("_") or "unknown_gpu"


def installed_fla_version() -> str | None:
    """The installed FLA kernels' release, read without importing FLA."""
    try:
        return importlib.metadata.version(FLA_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None


def shipped_fla_configs(gpu_name: str, fla_version: str | None) -> Path | None:
    """The shipped configuration folder for a GPU of this name, tuned with this FLA
    release, or None."""
    folder = SHIPPED_FLA_CONFIGS / gpu_folder(gpu_name)
    versions = folder / VERSIONS_FILE
    if fla_version is None or not versions.is_file():
        return None
    tuned_with = json.loads(versions.read_text()).get(FLA_DISTRIBUTION)
    if tuned_with != fla_version:
        log_autotune(
            "the configurations shipped for this GPU were tuned with %s %s, %s is installed",
            FLA_DISTRIBUTION, tuned_with, fla_version,
        )  # fmt: skip
        return None
    return folder


# The answer for each GPU in this process: FLA reads its variables once, so a later call
# (the loader's, after a target rank's pre-flight made the choice) repeats the first one's
# without announcing it again.
_CHOSEN: dict[str, Path | None] = {}


def use_shipped_fla_configs(device: torch.device) -> Path | None:
    """Point FLA at the configurations shipped for ``device``'s GPU, before FLA is
    imported; returns the folder FLA will read (None: none shipped, not CUDA, FLA already
    imported, or the user's own settings kept)."""
    if device.type != "cuda":
        return None
    gpu = torch.cuda.get_device_name(device)
    if gpu not in _CHOSEN:
        _CHOSEN[gpu] = _point_fla_at_shipped(gpu)
    return _CHOSEN[gpu]


def _point_fla_at_shipped(gpu: str) -> Path | None:
    """`use_shipped_fla_configs`' first answer for a GPU of this name, announced."""
    if any(os.environ.get(name) for name in ("FLA_CONFIG_DIR", "FLA_CACHE_MODE")):
        return None
    folder = shipped_fla_configs(gpu, installed_fla_version())
    if folder is None:
        if not (SHIPPED_FLA_CONFIGS / gpu_folder(gpu)).is_dir():
            log_autotune("no tuned configurations are shipped for the %s", gpu)
        return None
    if "fla" in sys.modules:
        log_autotune("FLA was imported before its tuned configurations could be set")
        return None
    os.environ["FLA_CONFIG_DIR"] = str(folder)
    os.environ["FLA_CACHE_MODE"] = FLA_CACHE_MODE
    log.info("FLA kernels take the configurations tuned for this GPU (%s)", folder.name)
    return folder
