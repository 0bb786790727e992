"""Where checkpoints lie and what a complete one holds.

Under a checkpoints root (`<run_dir>/checkpoints`):

    step_00000100/
        config.json          Qwen3 config + DFlash fields (see drafter/hf_config.py)
        model.safetensors    drafter weights only, fp32 master copy, DFlash names
        training_state.pt    optimiser, scheduler, step, RNG states (state.py)
        trainer_state.json   the ResumeRecord: step, run id, batch sequence, data cursors

Hidden `.tmp-*` and `.old-*` siblings are saves and deletions in progress (save.py,
retention.py), never checkpoints.
"""

from __future__ import annotations

import re
from pathlib import Path

from ringtrain.checkpoint.resume_record import RESUME_FILE

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
STATE_FILE = "training_state.pt"
REQUIRED_FILES = (CONFIG_FILE, WEIGHTS_FILE, STATE_FILE, RESUME_FILE)
STEP_DIR = re.compile(r"^step_(\d+)$")


class CheckpointError(RuntimeError):
    """A checkpoint that could not or must not be written or read; the message says why
    and what to do."""


def complete_checkpoints(root_dir: str | Path) -> list[Path]:
    """The step_N directories under root_dir holding every checkpoint file, newest first
    (unverified: see verify.py)."""
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
