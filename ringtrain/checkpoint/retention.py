"""Checkpoint retention: after each checkpoint write, keep only the newest `run.keep_checkpoints`.

Only complete step_N directories are counted and deleted; a save in progress writes into
a hidden temporary (see save.py), which is no step_N directory and never touched.
The checkpoint just written counts as the newest and is never deleted. Each deleted
checkpoint is first renamed to a hidden `.old-*` name (atomic), then removed, so an
interrupted deletion never leaves an incomplete step_N directory behind; the next save
removes the leftover. A deletion that fails is logged and training goes on.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from ringtrain.checkpoint.layout import complete_checkpoints

log = logging.getLogger(__name__)


def prune_checkpoints(root_dir: str | Path, keep: int, written: Path) -> list[Path]:
    """Delete the complete checkpoints under `root_dir` but the newest `keep` (0: keep all),
    `written` (the one just written) counted first; returns the deleted ones."""
    if keep == 0:
        return []
    older = [entry for entry in complete_checkpoints(root_dir) if entry.name != written.name]
    deleted = []
    for entry in older[keep - 1 :]:
        hidden = entry.with_name(f".old-{entry.name}-{os.getpid()}")
        try:
            entry.rename(hidden)
            shutil.rmtree(hidden)
        except OSError as exc:
            log.warning("run.keep_checkpoints = %d: could not delete %s (%s)", keep, entry, exc)
            continue
        log.info("deleted checkpoint %s (run.keep_checkpoints = %d)", entry, keep)
        deleted.append(entry)
    return deleted
