"""Drafter checkpoints: a DFlash-loadable directory plus the training state for exact resume.

Layout under a checkpoints root:

    step_00000100/
        config.json          Qwen3 config + DFlash fields (see spec.hf_config_dict)
        model.safetensors    drafter weights only, fp32 master copy, DFlash names
        training_state.pt    optimiser, scheduler, step, RNG states
        trainer_state.json   the ResumeRecord: step, run id, batch sequence, data cursors

A checkpoint is written into a hidden temporary sibling, every file and the directory are
fsync'ed, and only then is it renamed to its final name, so a directory named step_N is
always complete; `latest_checkpoint` also checks the files and ignores temporaries. A
failed write (disk full, ...) removes its temporary and raises CheckpointError naming the
path, the free space and what the checkpoint needs; free space is checked before writing.
Weights that are not all finite are never written.

The record may carry a `run_id`: `latest_checkpoint(root, run_id)` then skips checkpoints
of another run (those written without one are taken as this run's).

Checkpoints are verified before use (`checkpoint_problem`): every file readable, the
weights all finite. `latest_checkpoint` falls back from a bad newest checkpoint to the
newest good one with a warning naming the bad one and why, and `checkpoint_spec` (what
evaluation reads first) refuses a checkpoint whose weights are unreadable or not finite.
`training_state.pt` is read with `weights_only=True`, allowing exactly the NumPy types of
the RNG state it holds, so a run directory from elsewhere cannot run code on resume.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import random
import re
import shutil
import stat
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import torch
from numpy._core.multiarray import _reconstruct
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import nn

from ringtrain.drafter.arch import build_drafter
from ringtrain.drafter.hf_config import hf_config_dict, spec_from_hf_config
from ringtrain.drafter.resume_record import (
    RESUME_FILE,
    ResumeRecord,
    encode_resume_record,
    read_resume_record,
)
from ringtrain.drafter.spec import DrafterSpec

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
STATE_FILE = "training_state.pt"
REQUIRED_FILES = (CONFIG_FILE, WEIGHTS_FILE, STATE_FILE, RESUME_FILE)
STEP_DIR = re.compile(r"^step_(\d+)$")
# Room left beyond the tensors' bytes for pickling, JSON and file-system overhead.
SIZE_MARGIN_BYTES = 1 << 20
# What training_state.pt holds besides tensors and builtins: NumPy's RNG state array.
STATE_GLOBALS = [np.ndarray, np.dtype, _reconstruct, type(np.dtype(np.uint32))]

log = logging.getLogger(__name__)


class CheckpointError(RuntimeError):
    """A checkpoint that could not or must not be written; the message says why and what to do."""


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def rng_states() -> dict[str, Any]:
    """This process's Python, NumPy, torch CPU and CUDA generator states."""
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def restore_rng_states(states: dict[str, Any]) -> None:
    """Undo rng_states(): put every global generator back where it was."""
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
    if states["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def save_checkpoint(
    root_dir: str | Path,
    step: int,
    model: nn.Module,
    spec: DrafterSpec,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    record: ResumeRecord,
) -> Path:
    """Write checkpoint `root_dir/step_<step>` atomically and return its path.

    `record` is its resume record (step, run id, data cursors). An existing checkpoint of
    the same step is replaced.
    """
    root = Path(root_dir)
    root.mkdir(parents=True, exist_ok=True)
    name = f"step_{step:08d}"
    final = root / name
    drafter = getattr(model, "module", model)
    weights = {k: v.detach().cpu().contiguous() for k, v in drafter.state_dict().items()}
    _check_finite(weights, final)
    state = {
        "step": step,
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "rng": rng_states(),
    }
    need = _expected_bytes(weights, state["optimizer"])
    # One writer per run: any temporary here is this one's or a crashed save's leftover.
    remove_partial_checkpoints(root)
    _check_free_space(root, final, need)
    tmp = root / f".tmp-{name}-{os.getpid()}"
    try:
        _write_files(tmp, weights, spec, state, record)
    except (OSError, RuntimeError) as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(
            f"writing checkpoint {final} failed ({exc}); {_space_note(root, need)}"
        ) from exc
    previous = root / f".old-{name}-{os.getpid()}"
    if final.exists():
        final.rename(previous)
    tmp.rename(final)
    _fsync_path(root)
    if previous.exists():
        shutil.rmtree(previous)
    return final


def _write_files(
    tmp: Path,
    weights: dict[str, torch.Tensor],
    spec: DrafterSpec,
    state: dict[str, Any],
    record: ResumeRecord,
) -> None:
    """Write and fsync every file of a checkpoint into the new directory `tmp`."""
    tmp.mkdir()
    (tmp / CONFIG_FILE).write_text(json.dumps(hf_config_dict(spec), indent=2) + "\n")
    save_file(weights, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
    _match_mode(tmp / WEIGHTS_FILE, tmp / CONFIG_FILE)
    torch.save(state, tmp / STATE_FILE)
    (tmp / RESUME_FILE).write_bytes(encode_resume_record(record))
    for file in REQUIRED_FILES:
        _fsync_path(tmp / file)
    _fsync_path(tmp)


def _match_mode(file: Path, like: Path) -> None:
    """Give `file` the permission bits of `like`: safetensors creates its file 0600, where
    files opened by Python get 0666 less the umask (chmod only where they differ, so a file
    system without modes is left alone)."""
    mode = stat.S_IMODE(like.stat().st_mode)
    if stat.S_IMODE(file.stat().st_mode) != mode:
        file.chmod(mode)


def remove_partial_checkpoints(root_dir: str | Path) -> list[Path]:
    """Delete what interrupted saves left under a checkpoints root; returns what was removed."""
    root = Path(root_dir)
    if not root.is_dir():
        return []
    leftovers = [*root.glob(".tmp-*"), *root.glob(".old-*")]
    for leftover in leftovers:
        shutil.rmtree(leftover, ignore_errors=True)
    return leftovers


def _check_finite(weights: dict[str, torch.Tensor], final: Path) -> None:
    bad = {name: int((~torch.isfinite(t)).sum()) for name, t in weights.items()}
    bad = {name: count for name, count in bad.items() if count}
    if bad:
        total = sum(t.numel() for t in weights.values())
        first = next(iter(bad))
        raise CheckpointError(
            f"refusing to write checkpoint {final}: {sum(bad.values())} of {total} weight "
            f"values are not finite (NaN or inf; first in {first}); the newest complete "
            "checkpoint is intact: resume from it with a lower optim.lr"
        )


def _expected_bytes(weights: dict[str, torch.Tensor], optimizer_state: dict[str, Any]) -> int:
    """About what a checkpoint of these weights and this optimiser state takes on disk."""
    tensors = list(weights.values()) + [
        value
        for per_param in optimizer_state["state"].values()
        for value in per_param.values()
        if isinstance(value, torch.Tensor)
    ]
    return sum(t.numel() * t.element_size() for t in tensors) + SIZE_MARGIN_BYTES


def _mib(count: int) -> str:
    return f"{count / (1 << 20):,.1f} MiB"


def _space_note(root: Path, need: int) -> str:
    free = shutil.disk_usage(root).free
    verdict = "not enough space" if free < need else "space looks sufficient"
    return (
        f"the file system of {root} has {_mib(free)} free and the checkpoint needs about "
        f"{_mib(need)} ({verdict})"
    )


def _check_free_space(root: Path, final: Path, need: int) -> None:
    if shutil.disk_usage(root).free < need:
        raise CheckpointError(
            f"cannot write checkpoint {final}: {_space_note(root, need)}; free space there "
            "or move run.run_dir, then resume"
        )


def complete_checkpoints(root_dir: str | Path) -> list[Path]:
    """The step_N directories under root_dir holding every checkpoint file, newest first
    (unverified: see checkpoint_problem)."""
    root = Path(root_dir)
    if not root.is_dir():
        return []
    steps = sorted(
        (
            (int(match.group(1)), entry)
            for entry in root.iterdir()
            if (match := STEP_DIR.match(entry.name))
        ),
        reverse=True,
    )
    return [entry for _, entry in steps if all((entry / f).is_file() for f in REQUIRED_FILES)]


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
        _load_state(path / STATE_FILE, mmap=True)
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


def _reason(exc: Exception) -> str:
    """The line of a loading error that says what is wrong (torch's are long)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    unpickler = [line for line in lines if line.startswith("WeightsUnpickler error")]
    return (unpickler or lines or [type(exc).__name__])[0]


def _load_state(file: Path, mmap: bool = False) -> dict[str, Any]:
    """training_state.pt, loaded without running code; raises CheckpointError naming it."""
    try:
        with torch.serialization.safe_globals(STATE_GLOBALS):
            state = torch.load(file, map_location="cpu", weights_only=True, mmap=mmap)
    except (RuntimeError, OSError, EOFError, ValueError, KeyError, pickle.UnpicklingError) as exc:
        raise CheckpointError(f"{file} cannot be read ({_reason(exc)})") from None
    if not isinstance(state, dict) or "step" not in state:
        raise CheckpointError(f"{file} is not a training state (no step)")
    return state


@dataclass
class LoadedCheckpoint:
    """A loaded drafter (None when loaded without weights), its spec and training state."""

    path: Path
    spec: DrafterSpec
    model: nn.Module | None
    step: int
    training_state: dict[str, Any]

    @property
    def record(self) -> ResumeRecord:
        """The resume record given to save_checkpoint (data cursors, ...)."""
        return read_resume_record(self.path)

    @property
    def saved_schedule(self) -> dict[str, Any]:
        """The learning-rate scheduler's state dict at the save (what it was, for comparison:
        a resumed run rebuilds its schedule from the config, see drafter/optim.py)."""
        return self.training_state["scheduler"]

    def restore(self, optimizer: torch.optim.Optimizer, rng: bool = True) -> None:
        """Load the optimiser state (moments and settings as saved) and the global RNG
        states; drafter/optim.py's resume_settings and schedule_at then apply the config."""
        optimizer.load_state_dict(self.training_state["optimizer"])
        if rng:
            restore_rng_states(self.training_state["rng"])


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


def saved_optimizer_state(checkpoint: str | Path) -> dict[str, Any]:
    """The optimiser state dict in a checkpoint directory, its tensors mapped from the file
    rather than read (cheap: for checks before a resume)."""
    return _load_state(Path(checkpoint) / STATE_FILE, mmap=True)["optimizer"]


def load_checkpoint(
    path_or_root: str | Path, device: torch.device | str, weights: bool = True
) -> LoadedCheckpoint:
    """Load a checkpoint directory, or the latest complete one under a checkpoints root.

    With weights=False only the spec and the training state are read (model is None),
    e.g. for a tool that needs just the step and the training state.
    """
    path = Path(path_or_root)
    if not (path / CONFIG_FILE).is_file():
        latest = latest_checkpoint(path)
        if latest is None:
            raise FileNotFoundError(
                f"{path}: neither a checkpoint directory (no {CONFIG_FILE}) nor a root "
                "holding a complete step_N checkpoint"
            )
        path = latest
    spec = checkpoint_spec(path)
    model = None
    if weights:
        with torch.device(device):
            model = build_drafter(spec)
        model.load_state_dict(load_file(str(path / WEIGHTS_FILE), device=str(device)))
    state = _load_state(path / STATE_FILE)
    return LoadedCheckpoint(
        path=path, spec=spec, model=model, step=state["step"], training_state=state
    )
