"""run.keep_checkpoints: a real run keeps only the newest checkpoints, every file of a
checkpoint has the same mode, and a resume from the newest kept one continues the run.
The retention function itself never deletes the checkpoint just written, a save in
progress, or an incomplete step directory."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from ringtrain.drafter import load_checkpoint
from ringtrain.drafter.checkpoint import REQUIRED_FILES
from ringtrain.drafter.retention import prune_checkpoints
from tests.launcher import run_training, step_records


def _modes(checkpoint: Path) -> set[int]:
    return {stat.S_IMODE(file.stat().st_mode) for file in checkpoint.iterdir()}


@pytest.mark.slow
def test_a_run_keeps_the_newest_checkpoints_and_resumes_from_them(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    overrides = [
        "run.max_steps=8",
        "run.checkpoint_every=2",
        "run.keep_checkpoints=2",
        "run.eval_every=0",
        "run.name=keep",
    ]
    finished = run_training(run_dir, 1, 1, overrides)
    assert finished.returncode == 0, finished.stderr[-4000:]
    checkpoints = run_dir / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step_00000006", "step_00000008"]
    umask = os.umask(0)
    os.umask(umask)
    for checkpoint in checkpoints.iterdir():
        assert _modes(checkpoint) == {0o666 & ~umask}, checkpoint

    resumed = run_training(run_dir, 1, 1, [*overrides[1:], "run.max_steps=10"], resume=True)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert [r["step"] for r in step_records(run_dir)] == list(range(1, 11))
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step_00000008", "step_00000010"]
    assert load_checkpoint(checkpoints, "cpu", weights=False).step == 10


def _fake_checkpoint(root: Path, name: str, files: tuple[str, ...] = REQUIRED_FILES) -> Path:
    """A directory holding the named files (retention looks at names, not contents)."""
    directory = root / name
    directory.mkdir(parents=True)
    for file in files:
        (directory / file).write_text("x")
    return directory


def test_retention_spares_the_written_partial_and_incomplete_checkpoints(tmp_path: Path) -> None:
    """The one just written counts as the newest even when an older run left a higher
    step; a temporary of a save in progress and an incomplete directory are not counted."""
    for step in (1, 2, 3, 9):
        _fake_checkpoint(tmp_path, f"step_{step:08d}")
    written = _fake_checkpoint(tmp_path, "step_00000004")
    partial = _fake_checkpoint(tmp_path, f".tmp-step_00000005-{os.getpid()}", ("config.json",))
    incomplete = _fake_checkpoint(tmp_path, "step_00000000", ("config.json",))
    deleted = prune_checkpoints(tmp_path, 2, written)
    assert sorted(p.name for p in deleted) == ["step_00000001", "step_00000002", "step_00000003"]
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted([partial.name, incomplete.name, "step_00000004", "step_00000009"])
    assert prune_checkpoints(tmp_path, 0, written) == []  # 0 keeps all
