"""What a checkpoint records of its batch sequence, and what --resume makes of a change
(in one process; tests/test_resume_guard.py runs the refusal through torchrun)."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from types import SimpleNamespace

import msgspec
import numpy as np
import pytest

from ringtrain.checkpoint.resume_checks import check_resume_stream, stream_identity
from ringtrain.checkpoint.resume_record import (
    RESUME_FILE,
    CheckpointFormatError,
    ResumeRecord,
    StreamIdentity,
    encode_resume_record,
    read_resume_record,
)
from ringtrain.config import Config, ConfigError, LayoutConfig
from ringtrain.data import open_dataset, write_synthetic_dataset
from ringtrain.data.config import DataConfig

BLOCK = 8


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("data") / "data"
    write_synthetic_dataset(directory, rows=40, vocab_size=64, mean_len=200, seed=0)
    return directory


def identity(
    data_dir: Path, targets: int = 2, target_tp: int = 1, **data: object
) -> StreamIdentity:
    config = Config(
        data=DataConfig(**{"token_budget": 2048, "max_len": 512, "bucket": 64, **data}),
        layout=LayoutConfig(target_tp=target_tp),
    )
    dataset = open_dataset(
        data_dir, max_len=config.data.max_len, truncate=config.data.truncate, block_size=BLOCK
    )
    return stream_identity(config, dataset, targets)


def checkpoint_with(tmp_path: Path, stream: StreamIdentity | None) -> Path:
    path = tmp_path / "step_00000004"
    path.mkdir()
    (path / RESUME_FILE).write_bytes(encode_resume_record(ResumeRecord(step=4, stream=stream)))
    return path


@pytest.mark.parametrize(
    ("change", "setting"),
    [
        ({"seed": 7}, "data.seed is 7 but checkpoint .* was trained with 0"),
        ({"bucket": 32}, "data.bucket is 32 but checkpoint .* was trained with 64"),
        ({"max_len": 256}, "data.max_len is 256 but checkpoint .* was trained with 512"),
        ({"truncate": False}, "data.truncate is False but checkpoint .* was trained with True"),
    ],
)
def test_a_change_of_the_batch_sequence_is_refused_naming_it(
    data_dir: Path, tmp_path: Path, change: dict, setting: str
) -> None:
    checkpoint = checkpoint_with(tmp_path, identity(data_dir))
    check_resume_stream(checkpoint, identity(data_dir), announce=True)
    with pytest.raises(ConfigError, match=setting):
        check_resume_stream(checkpoint, identity(data_dir, **change), announce=True)


def test_another_target_count_or_target_group_size_is_refused_naming_it(
    data_dir: Path, tmp_path: Path
) -> None:
    """The producers (target groups) shard the data: their count decides the batch
    sequence as much as the [data] settings do."""
    checkpoint = checkpoint_with(tmp_path, identity(data_dir, targets=2, target_tp=1))
    check_resume_stream(checkpoint, identity(data_dir, targets=2, target_tp=1), announce=True)
    with pytest.raises(
        ConfigError,
        match=r"target count \(layout.targets_per_node x nodes\) is 4 but checkpoint .* was "
        "trained with 2",
    ):
        check_resume_stream(checkpoint, identity(data_dir, targets=4), announce=True)
    with pytest.raises(
        ConfigError, match=r"layout\.target_tp is 2 but checkpoint .* trained with 1"
    ):
        check_resume_stream(checkpoint, identity(data_dir, targets=2, target_tp=2), announce=True)


def test_other_rows_under_the_same_path_are_refused(data_dir: Path, tmp_path: Path) -> None:
    saved = identity(data_dir)
    changed = msgspec.structs.replace(saved, row_lengths_hash="0" * 16)
    checkpoint = checkpoint_with(tmp_path, changed)
    with pytest.raises(ConfigError, match=r"dataset row lengths \(hash\) is '[0-9a-f]{16}'"):
        check_resume_stream(checkpoint, saved, announce=True)


def test_rows_of_other_lengths_with_the_same_totals_change_the_identity() -> None:
    """Rows and tokens alike, the rows' lengths in another order: another batch sequence."""
    config = Config(data=DataConfig(token_budget=2048, max_len=512, bucket=64))

    def of(lengths: list[int]) -> StreamIdentity:
        dataset = SimpleNamespace(
            path=Path("data"),
            num_rows=len(lengths),
            num_tokens=sum(lengths),
            row_length=np.array(lengths, dtype=np.int32),
        )
        return stream_identity(config, dataset, targets=1)

    assert of([30, 50, 40]) == of([30, 50, 40])
    assert of([30, 50, 40]).row_lengths_hash != of([30, 40, 50]).row_lengths_hash


def test_a_moved_dataset_is_accepted_with_a_word(
    data_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    moved = Path(shutil.copytree(data_dir, tmp_path / "moved"))
    checkpoint = checkpoint_with(tmp_path, identity(data_dir))
    with caplog.at_level(logging.INFO, logger="ringtrain"):
        check_resume_stream(checkpoint, identity(moved), announce=True)
    assert f"the dataset moved from {data_dir} to {moved} (same rows)" in caplog.text


def test_a_checkpoint_without_the_record_resumes_with_a_warning(
    data_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    checkpoint = checkpoint_with(tmp_path, None)
    with caplog.at_level(logging.WARNING, logger="ringtrain"):
        check_resume_stream(checkpoint, identity(data_dir), announce=True)
    assert "does not record its batch sequence" in caplog.text
    assert "cannot be checked" in caplog.text


def test_a_record_of_the_format_before_versions_is_refused_naming_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "step_00000004"
    path.mkdir()
    old = {"step": 4, "extra": {"cursors": {"0": {"start": 3, "skip": []}}, "step": 4}}
    (path / RESUME_FILE).write_text(json.dumps(old))
    with pytest.raises(CheckpointFormatError, match=rf"{path / RESUME_FILE}: .*before .*versioned"):
        read_resume_record(path)
    with pytest.raises(CheckpointFormatError, match="start a new run"):
        read_resume_record(path)
