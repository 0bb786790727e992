"""Names of a ring's POSIX objects, /dev/shm free-space check and stale-run cleanup.

Every object of run R is named `ringtrain.R.<part>`: shared memory `/ringtrain.R.ctl`
and `/ringtrain.R.data`, semaphores `/ringtrain.R.ready` and `/ringtrain.R.free<i>`
(Linux shows them as /dev/shm/sem.ringtrain.R.*), and the FIFO lock file
`<lock_dir>/ringtrain.R.lock`. The control segment is created first and unlinked
last, so a run whose control segment is gone owns nothing that is still needed. A
control segment that is not a ring's (no magic number and layout version, and not being
initialised) is junk: `ringtrain-stat` names and skips it, and a ring's start removes it
with the run's other objects, as it removes those of dead runs, unless a live process
has it mapped (a ring of another installed ringtrain version's layout is left alone).
"""

from __future__ import annotations

import logging
import os
import re
import time
import zlib

import numpy as np
import posix_ipc

from ringtrain.ring.control import HEADER, header_problem, read_header
from ringtrain.ring.errors import RingError, ShmTooSmall
from ringtrain.ring.liveness import mapping_pid, process_alive

SHM_DIR = "/dev/shm"
PREFIX = "ringtrain."
SEM_PREFIX = "sem."
# A control segment still being initialised (no creator pid yet) is stale after this.
INIT_GRACE_S = 30.0

log = logging.getLogger(__name__)


def ring_name_part(run_name: str) -> str:
    """The run name as it appears in ring ids: cut to 24 filesystem-safe characters."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", run_name)[:24]


def run_dir_digest(run_dir: str) -> str:
    """The digest of a resolved run directory that ring ids carry (8 hex digits)."""
    return f"{zlib.crc32(run_dir.encode()) & 0xFFFFFFFF:08x}"


def ring_id(run_name: str, run_dir: str, node_rank: int) -> str:
    """A node-unique, filesystem-safe ring name of a run: its name, a digest of its
    resolved run directory, and the node, e.g. ``tiny-1a2b3c4d-n0``. ``ringtrain-stat``
    finds a run's ring from either part."""
    return f"{ring_name_part(run_name)}-{run_dir_digest(run_dir)}-n{node_rank}"


def ctl_name(run_id: str) -> str:
    """POSIX name of the control segment."""
    return f"/{PREFIX}{run_id}.ctl"


def data_name(run_id: str) -> str:
    """POSIX name of the host payload segment."""
    return f"/{PREFIX}{run_id}.data"


def ready_sem_name(run_id: str) -> str:
    """POSIX name of the shared `ready` semaphore."""
    return f"/{PREFIX}{run_id}.ready"


def free_sem_name(run_id: str, producer: int) -> str:
    """POSIX name of producer `producer`'s `free` semaphore."""
    return f"/{PREFIX}{run_id}.free{producer}"


def lock_path(lock_dir: str, run_id: str) -> str:
    """Path of the file whose fcntl lock guards the ready FIFO."""
    return os.path.join(lock_dir, f"{PREFIX}{run_id}.lock")


def shm_path(posix_name: str) -> str:
    """Where Linux shows a POSIX shared-memory object."""
    return SHM_DIR + posix_name


def check_shm_space(needed_bytes: int, shm_dir: str = SHM_DIR) -> None:
    """Raise ShmTooSmall unless `shm_dir` has `needed_bytes` free; the message says the fix."""
    st = os.statvfs(shm_dir)
    free = st.f_bavail * st.f_frsize
    if needed_bytes > free:
        mib = 1 << 20
        raise ShmTooSmall(
            f"the ring needs {needed_bytes / mib:.1f} MiB in {shm_dir} but only "
            f"{free / mib:.1f} MiB are free (of {st.f_blocks * st.f_frsize / mib:.1f} MiB). "
            f"Fix: give the container more shared memory (docker run --shm-size="
            f"{max(1, -(-needed_bytes * 2 // (1 << 30)))}g ...), free space in {shm_dir}, or lower "
            f"ring.slots_per_producer / the token budget (data.token_budget) / use "
            f"ring.transport = 'device' on GPUs"
        )


def _run_of(entry: str) -> str | None:
    name = entry.removeprefix(SEM_PREFIX)
    if not name.startswith(PREFIX):
        return None
    run, _, part = name[len(PREFIX) :].rpartition(".")
    return run if run and part else None


def _ctl_state(run_id: str) -> tuple[bool, int, str | None]:
    """(creator alive, creator pid, why the segment is junk or None) of run `run_id`,
    judged from its control segment. A creator writes its pid first and the magic number
    last, so a segment without magic is being initialised while its creator lives (or,
    for a segment not yet sized or stamped, for INIT_GRACE_S after its creation)."""
    path = shm_path(ctl_name(run_id))
    try:
        head = read_header(path)
        age = time.time() - os.stat(path).st_mtime
    except FileNotFoundError:
        return False, 0, None
    problem = header_problem(head)
    if problem is not None and any(head[:8]):
        # Not this layout (another version's ring, or not a ring at all): junk, unless a
        # live process has it mapped, e.g. a run of another installed ringtrain version.
        user = mapping_pid(path)
        if user is not None:
            return True, user, f"{problem}; mapped by live pid {user}: left alone"
        return False, 0, problem
    if len(head) < HEADER.itemsize:
        return (True, 0, None) if not head and age < INIT_GRACE_S else (False, 0, problem)
    header = np.frombuffer(head, dtype=HEADER)[0]
    pid, start = int(header["creator_pid"]), int(header["creator_start"])
    if pid == 0:
        return age < INIT_GRACE_S, 0, None if age < INIT_GRACE_S else problem
    return process_alive(pid, start), pid, None


def junk_segments() -> list[tuple[str, str]]:
    """(path, what is wrong) of each control segment in /dev/shm that is not a ring's."""
    runs = sorted({r for e in os.listdir(SHM_DIR) if e.endswith(".ctl") and (r := _run_of(e))})
    return [
        (shm_path(ctl_name(run)), problem)
        for run in runs
        if (problem := _ctl_state(run)[2]) is not None
    ]


def remove_run(run_id: str, lock_dir: str) -> list[str]:
    """Unlink every object of `run_id` (control segment last); returns what was removed."""
    removed = []
    entries = [e for e in os.listdir(SHM_DIR) if _run_of(e) == run_id]
    entries.sort(key=lambda e: e.endswith(".ctl"))
    for entry in entries:
        try:
            if entry.startswith(SEM_PREFIX):
                posix_ipc.unlink_semaphore("/" + entry.removeprefix(SEM_PREFIX))
            else:
                posix_ipc.unlink_shared_memory("/" + entry)
            removed.append(entry)
        except (posix_ipc.ExistentialError, PermissionError):
            pass
    lock = lock_path(lock_dir, run_id)
    if os.path.exists(lock) and lock_dir != SHM_DIR:
        try:
            os.unlink(lock)
            removed.append(lock)
        except OSError:
            pass
    return removed


def _runs(lock_dir: str) -> list[str]:
    """The run ids that own an object in /dev/shm or a lock file in `lock_dir`."""
    runs = {r for e in os.listdir(SHM_DIR) if (r := _run_of(e))}
    if lock_dir != SHM_DIR and os.path.isdir(lock_dir):
        runs |= {r for e in os.listdir(lock_dir) if (r := _run_of(e))}
    return sorted(runs)


def remove_dead_runs(lock_dir: str = SHM_DIR) -> dict[str, list[str]]:
    """Remove the objects of every run whose creator is dead (and of junk segments);
    returns what was removed, by run. Objects of live runs are left alone."""
    removed_by_run = {}
    for run in _runs(lock_dir):
        alive, _pid, junk = _ctl_state(run)
        if alive:
            continue
        if removed := remove_run(run, lock_dir):
            removed_by_run[run] = removed
            if junk:
                log.info("removed junk ring objects %r (%s)", run, junk)
            else:
                log.info("removed %d stale shared-memory objects of dead run %r", len(removed), run)
    return removed_by_run


def clean_stale(run_id: str, lock_dir: str) -> None:
    """Remove objects of dead runs; raise if `run_id` itself is held by a live creator."""
    alive, pid, _junk = _ctl_state(run_id)
    if alive:
        raise RingError(
            f"ring {run_id!r} is already in use by a live process (pid {pid}); "
            f"pick another run id or stop that run"
        )
    remove_dead_runs(lock_dir)
