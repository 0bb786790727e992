"""Checkpoints are verified before use: a corrupt or NaN newest checkpoint is skipped for
the newest good one with a warning naming the file and why, evaluation refuses a drafter
with non-finite weights, and training_state.pt cannot run code when it is read."""

from __future__ import annotations

import logging
import os
import pathlib
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from ringtrain.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from ringtrain.checkpoint.layout import REQUIRED_FILES, STATE_FILE, WEIGHTS_FILE, CheckpointError
from ringtrain.checkpoint.resume_record import RESUME_FILE, ResumeRecord
from ringtrain.checkpoint.verify import checkpoint_problem, checkpoint_spec
from tests.helpers.checkpoints import trained_state

NAN_FP32 = b"\x00\x00\xc0\x7f"
INF_FP32 = b"\x00\x00\x80\x7f"


def _last_weight(value: bytes) -> Callable[[Path], None]:
    def flip(step: Path) -> None:
        """Overwrite the bytes of the last fp32 weight with `value`."""
        with (step / WEIGHTS_FILE).open("r+b") as weights:
            weights.seek(-4, 2)
            weights.write(value)

    return flip


_nan_weights = _last_weight(NAN_FP32)


def _truncate(name: str, keep: float) -> Callable[[Path], None]:
    def cut(step: Path) -> None:
        data = (step / name).read_bytes()
        (step / name).write_bytes(data[: int(len(data) * keep)])

    return cut


def _bad_json(step: Path) -> None:
    (step / RESUME_FILE).write_text('{"version": 1, "step": 100, "run')


CORRUPTIONS = {
    "nan-weights": (_nan_weights, WEIGHTS_FILE, "weight values are not finite"),
    "inf-weights": (_last_weight(INF_FP32), WEIGHTS_FILE, "weight values are not finite"),
    "truncated-weights": (_truncate(WEIGHTS_FILE, 0.5), WEIGHTS_FILE, "cannot be read"),
    "empty-weights": (_truncate(WEIGHTS_FILE, 0), WEIGHTS_FILE, "cannot be read"),
    "truncated-state": (_truncate(STATE_FILE, 0.5), STATE_FILE, "cannot be read"),
    "empty-state": (_truncate(STATE_FILE, 0), STATE_FILE, "cannot be read"),
    "invalid-trainer-state": (_bad_json, RESUME_FILE, "cannot be read (not JSON"),
}


@pytest.fixture
def two_checkpoints(tmp_path: Path) -> tuple[Path, Path]:
    spec, model, optimizer, scheduler = trained_state(steps=1)
    good = save_checkpoint(tmp_path, 50, model, spec, optimizer, scheduler, ResumeRecord(step=50))
    newest = save_checkpoint(
        tmp_path, 100, model, spec, optimizer, scheduler, ResumeRecord(step=100)
    )
    return good, newest


@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_a_bad_newest_checkpoint_falls_back_to_the_newest_good_one(
    two_checkpoints: tuple[Path, Path], corruption: str, caplog: pytest.LogCaptureFixture
) -> None:
    good, newest = two_checkpoints
    corrupt, file, reason = CORRUPTIONS[corruption]
    corrupt(newest)
    with caplog.at_level(logging.WARNING):
        assert latest_checkpoint(good.parent) == good
    warning = caplog.text
    assert f"skipping checkpoint {newest}" in warning and str(newest / file) in warning
    assert reason in warning
    problem = checkpoint_problem(newest)
    assert problem is not None and str(newest / file) in problem
    assert load_checkpoint(good.parent, "cpu").record.step == 50


@pytest.mark.parametrize("name", REQUIRED_FILES)
def test_a_checkpoint_missing_a_file_is_named_as_such(
    two_checkpoints: tuple[Path, Path], name: str
) -> None:
    _, newest = two_checkpoints
    (newest / name).unlink()
    assert checkpoint_problem(newest) == f"{newest / name} is missing"


def test_evaluation_refuses_a_drafter_with_non_finite_weights(
    two_checkpoints: tuple[Path, Path],
) -> None:
    good, newest = two_checkpoints
    _nan_weights(newest)
    with pytest.raises(ValueError, match=rf"{WEIGHTS_FILE}: 1 of \d+ weight values are not finite"):
        checkpoint_spec(newest)
    assert checkpoint_spec(good).block_size == 4


def test_weights_rewritten_after_a_verdict_are_checked_again(
    two_checkpoints: tuple[Path, Path],
) -> None:
    """Verdicts are kept per file version: weights rewritten later at the same size (a
    newer mtime) are read again, by the resume check and by evaluation alike."""
    _, newest = two_checkpoints
    assert checkpoint_problem(newest) is None
    assert checkpoint_spec(newest).block_size == 4
    weights = newest / WEIGHTS_FILE
    before = weights.stat()
    _nan_weights(newest)
    os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000_000))
    assert weights.stat().st_size == before.st_size
    problem = checkpoint_problem(newest)
    assert problem is not None and "1 of" in problem and "weight values are not finite" in problem
    with pytest.raises(ValueError, match="weight values are not finite"):
        checkpoint_spec(newest)


class _Planted:
    """Pickles to a call of Path.touch: what a hostile training_state.pt could run."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple:
        return (pathlib.Path.touch, (self.marker,))


def test_reading_the_training_state_runs_no_code(
    two_checkpoints: tuple[Path, Path], tmp_path: Path
) -> None:
    good, newest = two_checkpoints
    marker = tmp_path / "code-ran"
    state = torch.load(newest / STATE_FILE, weights_only=False)
    torch.save({**state, "planted": _Planted(marker)}, newest / STATE_FILE)
    with pytest.raises(CheckpointError, match=rf"{STATE_FILE} cannot be read"):
        load_checkpoint(newest, "cpu")
    assert latest_checkpoint(good.parent) == good
    assert not marker.exists()
    assert load_checkpoint(good, "cpu").step == 50  # NumPy RNG state is allowed
