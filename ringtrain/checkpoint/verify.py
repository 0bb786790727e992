"""Checking a checkpoint before it is used, and finding the newest good one.

`checkpoint_problem` says why a checkpoint must not be used: a file missing or unreadable,
weights not all finite. `latest_checkpoint` falls back from a bad newest checkpoint to the
newest good one with a warning naming the bad one and why, and skips checkpoints that
record another run id (those written without one are taken as this run's).
`checkpoint_spec` (what evaluation reads first) refuses a checkpoint whose weights are
unreadable or not finite. Verdicts are kept per file version (size, mtime).
"""

from __future__ import annotations

import json
import logging
from functools import cache
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from ringtrain.checkpoint.layout import (
    CONFIG_FILE,
    REQUIRED_FILES,
    STATE_FILE,
    WEIGHTS_FILE,
    CheckpointError,
    complete_checkpoints,
)
from ringtrain.checkpoint.resume_record import read_resume_record
from ringtrain.checkpoint.state import load_state
from ringtrain.drafter.hf_config import spec_from_hf_config
from ringtrain.drafter.spec import DrafterSpec

log = logging.getLogger(__name__)


def latest_checkpoint(root_dir: str | Path, run_id: str | None = None) -> Path | None:
    """The complete, verified step_N directory with the highest N under root_dir, or None.

    With `run_id`, checkpoints that record another run id are skipped. A newer checkpoint
    that fails verification is skipped with a warning naming it and why."""
    for entry in complete_checkpoints(root_dir):
        problem = checkpoint_problem(entry)
        if problem is not None:
            log.warning("skipping checkpoint %s: %s; falling back to an older one", entry, problem)
            continue
        if run_id is not None and read_resume_record(entry).run_id not in (None, run_id):
            continue
        return entry
    return None


def checkpoint_problem(path: str | Path) -> str | None:
    """Why checkpoint directory `path` must not be used (naming the file), None if it can.

    Verdicts are kept per file versions (size, mtime), so checking again costs nothing."""
    path = Path(path)
    versions = tuple(_version(path / name) for name in REQUIRED_FILES)
    return _problem(path, versions)


def _version(file: Path) -> tuple[int, int]:
    try:
        status = file.stat()
    except FileNotFoundError:
        return (-1, -1)
    return status.st_size, status.st_mtime_ns


@cache
def _problem(path: Path, versions: tuple[tuple[int, int], ...]) -> str | None:
    for name, version in zip(REQUIRED_FILES, versions, strict=True):
        if version[0] < 0:
            return f"{path / name} is missing"
    try:
        spec_from_hf_config(json.loads((path / CONFIG_FILE).read_text()))
    except ValueError as exc:
        return f"{path / CONFIG_FILE} cannot be read ({exc})"
    try:
        read_resume_record(path)
        load_state(path / STATE_FILE, mmap=True)
    except (ValueError, CheckpointError) as exc:
        return str(exc)
    return _weights_problem(path / WEIGHTS_FILE, versions[REQUIRED_FILES.index(WEIGHTS_FILE)])


@cache
def _weights_problem(file: Path, version: tuple[int, int]) -> str | None:
    """What is wrong with a weights file (at `version`: size, mtime): unreadable, or
    values that are not finite."""
    bad, total, first = 0, 0, None
    try:
        with safe_open(str(file), framework="pt") as weights:
            for name in weights.keys():  # noqa: SIM118 (safe_open has no __iter__)
                tensor = weights.get_tensor(name)
                count = int((~torch.isfinite(tensor)).sum())
                bad, total = bad + count, total + tensor.numel()
                first = first or (name if count else None)
    except (SafetensorError, OSError) as exc:
        return f"{file} cannot be read ({exc})"
    if bad:
        return (
            f"{file}: {bad} of {total} weight values are not finite (NaN or inf; first in {first})"
        )
    return None


def checkpoint_spec(directory: str | Path) -> DrafterSpec:
    """The DrafterSpec saved in a checkpoint directory's config.json.

    Raises ValueError naming the file when it is no DFlash drafter config, or when the
    checkpoint's weights are unreadable or not all finite (a drafter not to be used)."""
    config_file = Path(directory) / CONFIG_FILE
    try:
        spec = spec_from_hf_config(json.loads(config_file.read_text()))
    except ValueError as exc:  # json.JSONDecodeError is one too
        raise ValueError(f"{config_file}: {exc}") from None
    weights = Path(directory) / WEIGHTS_FILE
    if weights.is_file() and (problem := _weights_problem(weights, _version(weights))):
        raise ValueError(f"refusing the drafter checkpoint: {problem}")
    return spec
