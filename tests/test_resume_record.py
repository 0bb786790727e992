"""A checkpoint's resume record read back (another version, a file that is no record, the
last held-out round), and what resume_training restores and applies: the RNG states as
saved, the optimiser's settings and run.max_steps as the config says now, each change
logged."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

import msgspec
import numpy as np
import pytest
import torch

from ringtrain.checkpoint.resume import ResumePoint, resume_training, save_training
from ringtrain.checkpoint.resume_record import (
    RESUME_FILE,
    CheckpointFormatError,
    ResumeRecord,
    StreamCursor,
    encode_resume_record,
    read_resume_record,
)
from tests.helpers.checkpoints import trained_state
from tests.helpers.tiny_drafter import paper_optim

CPU = torch.device("cpu")


def saved(tmp_path: Path, record: ResumeRecord) -> Path:
    """A checkpoint of a drafter trained for record.step steps (schedule over 10 steps)."""
    spec, model, optimizer, scheduler = trained_state(steps=record.step)
    return save_training(tmp_path, record, model, spec, optimizer, scheduler, keep=0)


def resumed(path: Path, total_steps: int = 10, **optim: object):
    """(where training resumes, the fresh optimiser the checkpoint was loaded into)."""
    _, fresh, optimizer, _ = trained_state(steps=0)
    point, _ = resume_training(path, fresh, optimizer, paper_optim(**optim), total_steps, CPU)
    return point, optimizer


def with_record_text(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "step_00000004"
    path.mkdir()
    (path / RESUME_FILE).write_text(text)
    return path


def test_a_record_of_another_version_is_refused_naming_both(tmp_path: Path) -> None:
    newer = msgspec.structs.replace(ResumeRecord(step=4), version=2)
    path = with_record_text(tmp_path, encode_resume_record(newer).decode())
    message = rf"{path / RESUME_FILE}: resume record v2, this ringtrain reads v1"
    with pytest.raises(CheckpointFormatError, match=message):
        read_resume_record(path)


@pytest.mark.parametrize("text", ["[4]", "4", '"step 4"', "null"])
def test_a_record_that_is_not_a_json_object_is_refused_naming_the_file(
    tmp_path: Path, text: str
) -> None:
    path = with_record_text(tmp_path, text)
    with pytest.raises(CheckpointFormatError, match=rf"{path / RESUME_FILE}: .*start a new run"):
        read_resume_record(path)


@pytest.mark.parametrize(
    "fields",
    [
        {"step": "four"},
        {"step": 4, "cursors": {"0": {"start": "3"}}},
        {"step": 4, "cursor": {"0": {"start": 3}}},  # a misspelt field
        {"step": 4, "cursors": {"0": {"start": 3, "skipped": [5]}}},
    ],
)
def test_a_record_of_wrong_or_unknown_fields_is_refused_naming_the_file(
    tmp_path: Path, fields: dict
) -> None:
    path = with_record_text(tmp_path, json.dumps({"version": 1, **fields}))
    with pytest.raises(CheckpointFormatError, match=rf"{path / RESUME_FILE}: not a valid resume"):
        read_resume_record(path)


def test_a_resume_before_any_completed_round_runs_every_round(tmp_path: Path) -> None:
    cursors = {0: StreamCursor(2, ())}
    path = saved(tmp_path, ResumeRecord(step=2, run_id="r", cursors=cursors, eval_step=0))
    assert read_resume_record(path).evaluated_step == 0
    point, _ = resumed(path)
    assert point == ResumePoint(step=2, cursors=cursors, evaluated_step=0)
    # a record written before eval_step was recorded ran every round up to its step
    assert ResumeRecord(step=2).evaluated_step == 2


def test_a_resume_puts_every_random_generator_back_as_saved(tmp_path: Path) -> None:
    path = saved(tmp_path, ResumeRecord(step=1, run_id="r"))
    after_save = (torch.rand(4), np.random.rand(4), random.random())
    torch.manual_seed(123), np.random.seed(123), random.seed(123)
    resumed(path)
    assert torch.equal(torch.rand(4), after_save[0])
    assert np.array_equal(np.random.rand(4), after_save[1])
    assert random.random() == after_save[2]


def test_a_resume_applies_and_logs_the_configs_optimiser_settings(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = saved(tmp_path, ResumeRecord(step=1, run_id="r"))
    with caplog.at_level(logging.INFO, logger="ringtrain"):
        _, optimizer = resumed(path, weight_decay=0.1, beta2=0.99)
    decay, no_decay = optimizer.param_groups
    assert decay["betas"] == (0.9, 0.99) and decay["weight_decay"] == 0.1
    assert no_decay["weight_decay"] == 0.0
    assert "resume applies the config's setting: optim.beta2 0.95 -> 0.99" in caplog.text
    assert "resume applies the config's setting: optim.weight_decay 0.0 -> 0.1" in caplog.text


def test_a_resume_logs_a_changed_run_max_steps_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = saved(tmp_path, ResumeRecord(step=1, run_id="r"))
    with caplog.at_level(logging.INFO, logger="ringtrain"):
        resumed(path, total_steps=10)
    assert "resumed from" in caplog.text and "run.max_steps" not in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="ringtrain"):
        resumed(path, total_steps=20)
    assert "resume applies the config's setting: run.max_steps 10 -> 20" in caplog.text
