"""Writing a drafter checkpoint: a DFlash-loadable directory plus the training state.

A checkpoint is written into a hidden temporary sibling, every file and the directory are
fsync'ed, and only then is it renamed to its final name (layout.py), so a directory named
step_N is always complete. A failed write (disk full, ...) removes its temporary and
raises CheckpointError naming the path, the free space and what the checkpoint needs;
free space is checked before writing. Weights that are not all finite are never written.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

from ringtrain.checkpoint.layout import (
    CONFIG_FILE,
    REQUIRED_FILES,
    STATE_FILE,
    WEIGHTS_FILE,
    CheckpointError,
)
from ringtrain.checkpoint.resume_record import RESUME_FILE, ResumeRecord, encode_resume_record
from ringtrain.checkpoint.state import rng_states
from ringtrain.drafter.hf_config import hf_config_dict
from ringtrain.drafter.spec import DrafterSpec

# Room left beyond the tensors' bytes for pickling, JSON and file-system overhead.
SIZE_MARGIN_BYTES = 1 << 20


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
