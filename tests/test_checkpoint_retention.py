"""run.keep_checkpoints: the retention function never deletes the checkpoint just written,
a save in progress, or an incomplete step directory. (A real run keeping only the newest
checkpoints over a kill, a stop and two resumes is in tests/test_trainer.py.)"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from ringtrain.checkpoint.layout import REQUIRED_FILES, complete_checkpoints
from ringtrain.checkpoint.retention import prune_checkpoints


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


def test_a_checkpoint_that_cannot_be_deleted_is_logged_and_the_others_go(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A deletion that fails (here: the hidden name it is moved to is taken by a
    non-empty directory) is logged; the other old checkpoints are still deleted."""
    for step in (1, 2, 3):
        _fake_checkpoint(tmp_path, f"step_{step:08d}")
    written = _fake_checkpoint(tmp_path, "step_00000004")
    _fake_checkpoint(tmp_path, f".old-step_00000002-{os.getpid()}", ("leftover",))
    with caplog.at_level(logging.WARNING):
        deleted = prune_checkpoints(tmp_path, 1, written)
    assert sorted(p.name for p in deleted) == ["step_00000001", "step_00000003"]
    assert (tmp_path / "step_00000002" / REQUIRED_FILES[0]).is_file()
    assert f"could not delete {tmp_path / 'step_00000002'}" in caplog.text


def test_checkpoints_are_ordered_by_step_number_and_a_users_copies_are_left_alone(
    tmp_path: Path,
) -> None:
    """Past 99,999,999 steps a name grows a digit: the order is numeric, not the names'.
    A copy a user made beside the checkpoints (step_N_copy, step_N.bak) is no checkpoint:
    retention neither counts nor deletes it."""
    for name in ("step_99999999", "step_100000000", "step_00000010"):
        _fake_checkpoint(tmp_path, name)
    copies = [_fake_checkpoint(tmp_path, n) for n in ("step_00000010_copy", "step_00000009.bak")]
    newest_first = [p.name for p in complete_checkpoints(tmp_path)]
    assert newest_first == ["step_100000000", "step_99999999", "step_00000010"]
    written = _fake_checkpoint(tmp_path, "step_100000001")
    deleted = prune_checkpoints(tmp_path, 2, written)
    assert sorted(p.name for p in deleted) == ["step_00000010", "step_99999999"]
    assert all((copy / REQUIRED_FILES[0]).is_file() for copy in copies)
