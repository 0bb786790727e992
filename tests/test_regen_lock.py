"""The lock of one output between clients: a live holder (a real process) refuses a
second client by pid and host, its lock is taken over once it is killed, a clean
release leaves no owner behind, a release that removes the file leaves none (and a
second release does nothing), the owner written replaces a longer stale one whole, a
lock file that names no owner is taken over as an unknown client's, an output's new
folder gets its lock file, and a client whose lock file was removed under it locks the
new file."""

from __future__ import annotations

import fcntl
import json
import multiprocessing as mp
import os
import socket
from pathlib import Path

import pytest

from ringtrain.data import regen_lock
from ringtrain.data.errors import DatasetError
from ringtrain.data.regen_lock import OutputLock, lock_path
from tests.helpers.lock_holder import hold_until_killed

CTX = mp.get_context("spawn")
WAIT_S = 60
HOST = socket.gethostname()


def test_a_live_holder_is_refused_by_name_and_a_killed_ones_lock_is_taken_over(
    tmp_path: Path,
) -> None:
    output = tmp_path / "out.jsonl"
    locked, never = CTX.Event(), CTX.Event()
    holder = CTX.Process(target=hold_until_killed, args=(str(output), locked, never))
    holder.start()
    try:
        assert locked.wait(WAIT_S), "the holder did not take the lock"
        with pytest.raises(DatasetError, match=rf"\(pid {holder.pid} on host {HOST}, holding"):
            OutputLock(output, "synthesize").acquire()
    finally:
        holder.kill()
        holder.join(WAIT_S)
    with OutputLock(output) as lock:
        assert lock.taken_over == f"pid {holder.pid} on host {HOST}"


def test_a_clean_release_leaves_no_owner_to_take_over(tmp_path: Path) -> None:
    output = tmp_path / "out.jsonl"
    with OutputLock(output):
        pass
    with OutputLock(output) as lock:
        assert lock.taken_over is None


def test_the_owner_replaces_a_longer_stale_one_whole(tmp_path: Path) -> None:
    output = tmp_path / "out.jsonl"
    stale = {"pid": 4_000_000, "host": "a-build-host-with-a-long-name.example.org"}
    lock_path(output).write_text(json.dumps(stale) + "\n")
    with OutputLock(output) as lock:
        assert lock.taken_over == f"pid 4000000 on host {stale['host']}"
        assert json.loads(lock_path(output).read_text()) == {"pid": os.getpid(), "host": HOST}


def test_a_lock_file_removed_under_a_client_is_not_the_one_it_keeps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first client ends a run that wrote nothing (removing the lock file) after the
    second opened the file but before it locked it: the second locks the new file, so
    a third is refused."""
    output = tmp_path / "out.jsonl"
    first, second = OutputLock(output), OutputLock(output)
    first.acquire()
    flock, released = fcntl.flock, []

    def first_releases_then_flock(fd: int, operation: int) -> None:
        if not released:
            first.release(remove=True)
            released.append(True)
        flock(fd, operation)

    monkeypatch.setattr(regen_lock.fcntl, "flock", first_releases_then_flock)
    second.acquire()
    monkeypatch.undo()
    assert lock_path(output).exists()
    with pytest.raises(DatasetError, match=rf"pid {os.getpid()} on host"):
        OutputLock(output).acquire()
    second.release()


def test_a_release_that_removes_the_file_leaves_none_and_a_second_release_does_nothing(
    tmp_path: Path,
) -> None:
    output = tmp_path / "out.jsonl"
    with OutputLock(output) as lock:
        assert lock_path(output).exists()
        lock.release(remove=True)  # a run that wrote nothing
        assert not lock_path(output).exists()
    assert not lock_path(output).exists()
    with OutputLock(output) as lock:
        assert lock.taken_over is None


@pytest.mark.parametrize("text", ['{"host": "elsewhere"}', '["pid", 7]', "not json at all"])
def test_a_lock_file_that_names_no_owner_is_taken_over_as_an_unknown_clients(
    tmp_path: Path, text: str
) -> None:
    output = tmp_path / "out.jsonl"
    lock_path(output).write_text(text + "\n")
    with OutputLock(output) as lock:
        assert lock.taken_over == f"an unknown client (the lock file holds {text!r})"
        assert json.loads(lock_path(output).read_text()) == {"pid": os.getpid(), "host": HOST}


def test_an_output_in_a_folder_not_made_yet_gets_its_lock_there(tmp_path: Path) -> None:
    output = tmp_path / "new" / "deeper" / "out.jsonl"
    with OutputLock(output):
        assert json.loads(lock_path(output).read_text())["pid"] == os.getpid()
        with pytest.raises(DatasetError, match="another regenerate client is writing it"):
            OutputLock(output).acquire()
