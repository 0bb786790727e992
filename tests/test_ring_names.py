"""The names of a ring's objects and the cleanup of dead runs (ringtrain/ring/names.py), on
real POSIX objects of made-up runs: ring ids, the shared-memory space check, which objects
belong to a run, the order they go in, a lock file outside /dev/shm, and a run still being
created left alone."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import posix_ipc
import pytest

from ringtrain.ring import names
from ringtrain.ring.errors import RingError, ShmTooSmall
from ringtrain.ring.names import (
    check_shm_space,
    clean_stale,
    ctl_name,
    data_name,
    free_sem_name,
    lock_path,
    remove_dead_runs,
    remove_run,
    ring_id,
    ring_name_part,
)


def test_a_ring_id_is_the_runs_name_its_directory_and_its_node() -> None:
    assert ring_name_part("my run.v2/x") == "my_run_v2_x"
    assert ring_name_part("a" * 30) == "a" * 24
    first = ring_id("tiny", "/runs/a", 0)
    assert first.startswith("tiny-") and first.endswith("-n0") and len(first) == 5 + 8 + 3
    assert ring_id("tiny", "/runs/a", 1) == first[:-1] + "1"
    assert ring_id("tiny", "/runs/b", 0) != first


def test_shared_memory_is_enough_up_to_the_last_byte(monkeypatch: pytest.MonkeyPatch) -> None:
    space = SimpleNamespace(f_bavail=1024, f_frsize=1 << 20, f_blocks=4096)  # 1 GiB of 4 free
    monkeypatch.setattr(names.os, "statvfs", lambda _path: space)
    check_shm_space(1 << 30)
    with pytest.raises(ShmTooSmall) as refusal:
        check_shm_space((1 << 30) + 1)
    message = str(refusal.value)
    assert "needs 1024.0 MiB in /dev/shm but only 1024.0 MiB are free (of 4096.0 MiB)" in message
    assert "docker run --shm-size=3g" in message  # twice what is needed, in whole GiB


@pytest.fixture
def run() -> Iterator[str]:
    """A made-up run id; whatever of it is left is removed afterwards."""
    run_id = f"t{uuid.uuid4().hex[:10]}"
    yield run_id
    remove_run(run_id, names.SHM_DIR)


def _segment(name: str, size: int = 0) -> None:
    posix_ipc.SharedMemory(name, posix_ipc.O_CREX, size=size).close_fd()


def test_a_runs_objects_go_control_segment_last_and_only_its_own(run: str, tmp_path: Path) -> None:
    _segment(ctl_name(run), 64)
    _segment(data_name(run), 64)
    posix_ipc.Semaphore(free_sem_name(run, 0), posix_ipc.O_CREX).close()
    _segment(data_name(run + "x"), 64)  # another run whose id starts alike
    lock = lock_path(str(tmp_path), run)
    Path(lock).write_text("")
    try:
        removed = remove_run(run, str(tmp_path))
        assert removed[-2:] == [ctl_name(run)[1:], lock]
        assert sorted(removed[:2]) == sorted([data_name(run)[1:], f"sem.ringtrain.{run}.free0"])
        assert not os.path.exists(lock)
        assert os.path.exists(names.shm_path(data_name(run + "x")))
    finally:
        remove_run(run + "x", names.SHM_DIR)


def test_a_run_still_being_created_is_left_alone_until_its_grace_ends(
    run: str, tmp_path: Path
) -> None:
    """A control segment not yet sized belongs to a creator still initialising it: its run
    is live (another start is refused), then dead once INIT_GRACE_S has passed."""
    _segment(ctl_name(run))
    lock = lock_path(str(tmp_path), run)
    Path(lock).write_text("")
    assert run not in remove_dead_runs(str(tmp_path))
    with pytest.raises(RingError, match=f"ring '{run}' is already in use by a live process"):
        clean_stale(run, str(tmp_path))
    past = time.time() - names.INIT_GRACE_S - 5
    os.utime(names.shm_path(ctl_name(run)), (past, past))
    assert remove_dead_runs(str(tmp_path))[run] == [ctl_name(run)[1:], lock]
    assert not os.path.exists(names.shm_path(ctl_name(run)))


def test_a_lock_file_alone_names_its_run(run: str, tmp_path: Path) -> None:
    lock = lock_path(str(tmp_path), run)
    Path(lock).write_text("")
    (tmp_path / "other.lock").write_text("")  # not a ring's
    assert remove_dead_runs(str(tmp_path))[run] == [lock]
    assert [p.name for p in tmp_path.iterdir()] == ["other.lock"]


def test_objects_that_are_not_a_rings_are_left_alone() -> None:
    """Another program's segment, and one named like a ring's without the part after the
    run id, belong to no run: the cleanup of dead runs does not touch them."""
    tag = uuid.uuid4().hex[:10]
    others = [f"/otherprogram.{tag}.data", f"/ringtrain.{tag}."]
    for name in others:
        _segment(name, 64)
    try:
        remove_dead_runs(names.SHM_DIR)
        assert all(os.path.exists(names.shm_path(name)) for name in others)
    finally:
        for name in others:
            posix_ipc.unlink_shared_memory(name)
