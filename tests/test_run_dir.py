"""Claiming and preparing a run directory in-process (the torchrun tests in test_resume_guard
cover the same through whole launches): the lock per node and the refusal naming the run
that holds it, the other local ranks waiting for their own launch's claim, a file system
without locks, and what a fresh start, an overwrite and a resume do to checkpoints, metrics
and the run id."""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from ringtrain.checkpoint.resume_record import ResumeRecord
from ringtrain.checkpoint.save import save_checkpoint
from ringtrain.config import ConfigError
from ringtrain.trainer import run_dir as run_dirs
from ringtrain.trainer.roles import RankInfo
from ringtrain.trainer.run_dir import (
    RUN_ID_FILE,
    claim_run_dir,
    lock_path,
    prepare_run_dir,
    read_run_id,
)
from tests.helpers.checkpoints import trained_state

CPU = torch.device("cpu")
# rank, world, local rank, local world, node, nodes, restarts, role, role index/count, split
RANK0 = RankInfo(0, 4, 0, 2, 0, 2, 0, "target", 0, 2, 1, 1, CPU)
LOCAL1 = RankInfo(1, 4, 1, 2, 0, 2, 0, "drafter", 0, 2, 1, 1, CPU)
NODE1 = RankInfo(2, 4, 0, 2, 1, 2, 0, "target", 1, 2, 1, 1, CPU)

# Holds an exclusive lock on argv[1] with a holder written into it, says so, waits for stdin.
HOLDER = """
import fcntl, json, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
os.write(fd, json.dumps({"host": "gpu-7", "pid": 4242, "since": "2026-12-01 10:00:00"}).encode())
print("locked", flush=True)
sys.stdin.read()
"""


@pytest.fixture(autouse=True)
def this_launch(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """torchrun's launch identity, and the module's held locks released after each test."""
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "launch-a")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    held: dict[Path, int] = {}
    monkeypatch.setattr(run_dirs, "_held_locks", held)
    yield
    for fd in held.values():
        os.close(fd)


def _holder(path: Path) -> dict:
    return json.loads(path.read_text())


def _checkpoint(run_dir: Path, step: int) -> Path:
    spec, model, optimizer, scheduler = trained_state(0)
    return save_checkpoint(
        run_dir / "checkpoints", step, model, spec, optimizer, scheduler, ResumeRecord(step=step)
    )


def test_each_node_has_a_lock_file_of_its_own(tmp_path: Path) -> None:
    assert lock_path(tmp_path, 0) == tmp_path / ".lock"
    assert lock_path(tmp_path, 2) == tmp_path / ".lock.node2"
    claim_run_dir(tmp_path, RANK0, resume=False, overwrite=False)
    claim_run_dir(tmp_path, NODE1, resume=False, overwrite=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock", ".lock.node1"]


def test_resume_with_overwrite_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--resume and --overwrite contradict each other"):
        claim_run_dir(tmp_path, RANK0, resume=True, overwrite=True)
    assert list(tmp_path.iterdir()) == []


def test_a_directory_another_process_holds_is_refused_naming_it(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(lock_path(tmp_path, 0))],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "locked\n"
        with pytest.raises(ConfigError) as refusal:
            claim_run_dir(tmp_path, RANK0, resume=False, overwrite=False)
        assert str(refusal.value) == (
            f"run.run_dir {tmp_path} is in use by another run (host gpu-7, pid 4242, since "
            "2026-12-01 10:00:00); wait for it to end or stop it, or choose another run.run_dir"
        )
        claim_run_dir(tmp_path, NODE1, resume=False, overwrite=False)  # another node's file
    finally:
        holder.communicate("")
    assert claim_run_dir(tmp_path, RANK0, resume=False, overwrite=False) == []
    written = _holder(lock_path(tmp_path, 0))
    assert (written["pid"], written["launch"]) == (os.getpid(), "launch-a/1")


def test_the_other_local_ranks_go_on_only_under_their_own_launchs_claim(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(run_dirs, "LOCK_WAIT_S", 0.3)
    path = lock_path(tmp_path, 0)
    claim_run_dir(tmp_path, RANK0, resume=False, overwrite=False)
    assert claim_run_dir(tmp_path, LOCAL1, resume=False, overwrite=False) == []
    claim = _holder(path)
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], check=True,
                           capture_output=True, text=True)  # fmt: skip
    for stale in (
        {"launch": "launch-a/0"},  # the same launch's earlier attempt
        {"launch": "launch-b/1"},
        {"host": "another-host"},
        {"pid": int(ended.stdout)},  # its rank 0 has ended
        {"pid": str(os.getpid())},  # not as the launcher writes it
    ):
        path.write_text(json.dumps({**claim, **stale}))
        with pytest.raises(ConfigError, match=f"did not take the run directory lock {path}"):
            claim_run_dir(tmp_path, LOCAL1, resume=False, overwrite=False)


def test_without_torchelastic_the_launch_is_the_rendezvous_address(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TORCHELASTIC_RUN_ID")
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT")
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.5")
    monkeypatch.setenv("MASTER_PORT", "29500")
    claim_run_dir(tmp_path, RANK0, resume=False, overwrite=False)
    assert _holder(lock_path(tmp_path, 0))["launch"] == "10.0.0.5:29500/0"


def test_a_file_system_without_locks_is_said_and_the_run_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(_fd: int, _how: int) -> None:
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(run_dirs.fcntl, "lockf", refuse)
    path = lock_path(tmp_path, 0)
    assert claim_run_dir(tmp_path, RANK0, resume=False, overwrite=False) == [
        f"{path}: this file system refuses locks ({os.strerror(errno.ENOLCK)}); nothing keeps "
        "a second run out of this run directory"
    ]
    assert _holder(path)["pid"] == os.getpid()


def test_a_fresh_start_over_checkpoints_needs_overwrite_which_removes_them(
    tmp_path: Path,
) -> None:
    _checkpoint(tmp_path, 3)
    _checkpoint(tmp_path, 7)
    (tmp_path / RUN_ID_FILE).write_text("earlier0run1\n")
    for name in ("metrics.jsonl", "metrics.jsonl.pre-resume"):
        (tmp_path / name).write_text("{}\n")
    with pytest.raises(ConfigError) as refusal:
        prepare_run_dir(tmp_path, RANK0, resume=False, overwrite=False)
    assert f"run.run_dir {tmp_path} holds checkpoints of an earlier run (newest step_" in str(
        refusal.value
    )
    assert "7): continue it with --resume, start over with --overwrite" in str(refusal.value)
    assert len(list((tmp_path / "checkpoints").iterdir())) == 2
    assert read_run_id(tmp_path) == "earlier0run1"

    claim_run_dir(tmp_path, RANK0, resume=False, overwrite=True)
    assert prepare_run_dir(tmp_path, RANK0, resume=False, overwrite=True) == [
        f"--overwrite: removed the earlier run's checkpoints under {tmp_path / 'checkpoints'}",
        "--overwrite: removed the earlier run's metrics.jsonl",
        "--overwrite: removed the earlier run's metrics.jsonl.pre-resume",
    ]
    run_id = read_run_id(tmp_path)
    assert re.fullmatch("[0-9a-f]{12}", run_id) and run_id != "earlier0run1"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock", RUN_ID_FILE]
    assert _holder(lock_path(tmp_path, 0))["run_id"] == run_id


def test_a_resume_keeps_the_run_id_and_removes_only_what_torn_saves_left(tmp_path: Path) -> None:
    newest = _checkpoint(tmp_path, 5)
    torn = tmp_path / "checkpoints" / ".tmp-step_9-77"
    torn.mkdir()
    (tmp_path / RUN_ID_FILE).write_text("samerun0001\n")
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    assert prepare_run_dir(tmp_path, RANK0, resume=True, overwrite=False) == [
        f"removed partial checkpoint {torn}"
    ]
    assert newest.is_dir() and not torn.exists()
    assert read_run_id(tmp_path) == "samerun0001"
    assert (tmp_path / "metrics.jsonl").read_text() == "{}\n"


def test_a_resume_where_no_run_id_was_written_draws_one(tmp_path: Path) -> None:
    assert prepare_run_dir(tmp_path, RANK0, resume=True, overwrite=False) == []
    assert re.fullmatch("[0-9a-f]{12}", read_run_id(tmp_path))


def test_earlier_metrics_without_a_run_id_move_aside_under_their_time(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl.pre-resume").write_text("{}\n")
    notes = prepare_run_dir(tmp_path, RANK0, resume=False, overwrite=False)
    assert len(notes) == 1
    kept = re.fullmatch(
        r"metrics.jsonl.pre-resume of the earlier run in this directory \(no checkpoint\) kept "
        r"as (metrics\.\d{8}-\d{6}\.jsonl\.pre-resume)",
        notes[0],
    )
    assert kept and (tmp_path / kept.group(1)).read_text() == "{}\n"


def test_only_global_rank_0_prepares_the_directory(tmp_path: Path) -> None:
    _checkpoint(tmp_path, 2)
    (tmp_path / "metrics.jsonl").write_text("{}\n")
    for rank in (LOCAL1, NODE1):
        assert prepare_run_dir(tmp_path, rank, resume=False, overwrite=True) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoints", "metrics.jsonl"]
