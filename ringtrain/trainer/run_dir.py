"""Claiming a run directory: one live run per directory, and a run id that survives resumes.

Local rank 0 of each node takes an exclusive lock (fcntl.lockf) on `<run_dir>/.lock`
(node 0) or `<run_dir>/.lock.node<N>` (node N) before the run writes anything, holds it
until its process ends, and writes its host, pid, run id and launch into it; a second run
in the same directory is refused naming the holder's host and pid. The other local ranks
write nothing until the lock file names their own launch (torchrun's run id and restart
count) held by a live process, so a refused launch leaves no trace in the directory. One
lock file per node: with a run directory on a shared file system (needed for resume on
several nodes), every node's local rank 0 locks its own file, so the nodes of one run do
not refuse each other, while a second run started on any node of the first is refused on
that node. The file system must support POSIX locks (NFSv4 does); where it does not, the
run goes on without the lock and says so.

Once the inputs are validated (so a refused start deletes nothing), global rank 0 decides
what the run is (`prepare_run_dir`): a fresh start in a directory holding checkpoints is
refused unless --overwrite (which deletes the old checkpoints and metrics); the metrics
of an earlier run that left no checkpoint move aside (`metrics.<its run id>.jsonl`), so a
fresh start has nothing to supersede; a fresh start draws a new run id (`<run_dir>/run_id`), a
resume keeps it; partial checkpoints that interrupted saves left are removed. Every checkpoint
records the run id, and a resume takes only checkpoints of its own run
(ringtrain/checkpoint/verify.py).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import socket
import time
import uuid
from pathlib import Path

from ringtrain.checkpoint.save import remove_partial_checkpoints
from ringtrain.checkpoint.verify import latest_checkpoint
from ringtrain.config import ConfigError
from ringtrain.trainer.roles import RankInfo

LOCK_FILE = ".lock"
RUN_ID_FILE = "run_id"
METRICS_FILES = ("metrics.jsonl", "metrics.jsonl.pre-resume")
# How long the other local ranks wait for local rank 0 to take the lock.
LOCK_WAIT_S = 300.0
LOCK_POLL_S = 0.05
_held_locks: dict[Path, int] = {}  # descriptors kept open (and locked) for the process's life


def lock_path(run_dir: Path, node_rank: int) -> Path:
    """The lock file of node `node_rank` in `run_dir`."""
    return run_dir / (LOCK_FILE if node_rank == 0 else f"{LOCK_FILE}.node{node_rank}")


def launch_key() -> str:
    """What identifies this launch's processes (the same on every rank of one attempt)."""
    env = os.environ
    launch = env.get("TORCHELASTIC_RUN_ID") or f"{env.get('MASTER_ADDR')}:{env.get('MASTER_PORT')}"
    return f"{launch}/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"


def read_run_id(run_dir: Path) -> str | None:
    """The run id of the run in `run_dir` (None: none recorded yet)."""
    try:
        return (run_dir / RUN_ID_FILE).read_text().strip() or None
    except FileNotFoundError:
        return None


def claim_run_dir(run_dir: Path, info: RankInfo, resume: bool, overwrite: bool) -> list[str]:
    """Take this node's lock (local rank 0) or wait until it is taken for this launch
    (other local ranks). Raises ConfigError (exit 2) when refused; returns lines for the
    log. Nothing in the directory changes until `prepare_run_dir`."""
    if resume and overwrite:
        raise ConfigError("--resume and --overwrite contradict each other: give one of them")
    path = lock_path(run_dir, info.node_rank)
    if info.local_rank != 0:
        _wait_for_claim(path)
        return []
    fd, notes = _take_lock(path)
    _write_holder(fd, run_dir)
    return notes


def prepare_run_dir(run_dir: Path, info: RankInfo, resume: bool, overwrite: bool) -> list[str]:
    """On global rank 0, after the inputs are validated: prepare the directory for a fresh
    start or a resume (see the module docstring). Raises ConfigError when refused; returns
    lines for the log. Other ranks see the result once the world is joined."""
    if info.rank != 0:
        return []
    notes = _prepare(run_dir, resume, overwrite)
    if (fd := _held_locks.get(lock_path(run_dir, info.node_rank))) is not None:
        _write_holder(fd, run_dir)  # with the run id the start decided
    return notes


def _write_holder(fd: int, run_dir: Path) -> None:
    """Write who holds the lock into the lock file (in place: the lock is on this file)."""
    holder = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "run_id": read_run_id(run_dir),
        "launch": launch_key(),
        "since": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
    os.fsync(fd)


def _take_lock(path: Path) -> tuple[int, list[str]]:
    """This node's lock file, locked (kept open for the process's life), and log lines."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno not in (errno.EACCES, errno.EAGAIN):
            _held_locks[path] = fd
            return fd, [f"{path}: this file system refuses locks ({exc.strerror}); nothing "
                        "keeps a second run out of this run directory"]  # fmt: skip
        holder = _read_holder(path)
        os.close(fd)
        who = (
            f"host {holder.get('host')}, pid {holder.get('pid')}, since {holder.get('since')}"
            if holder
            else "its host and pid not written yet"
        )
        raise ConfigError(
            f"run.run_dir {path.parent} is in use by another run ({who}); wait for it to "
            "end or stop it, or choose another run.run_dir"
        ) from None
    _held_locks[path] = fd
    return fd, []


def _read_holder(path: Path) -> dict:
    try:
        holder = json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


def _pid_alive(pid: object) -> bool:
    if not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _wait_for_claim(path: Path) -> None:
    """Return once the lock file names this launch's live local rank 0 as its holder."""
    host, launch = socket.gethostname(), launch_key()
    deadline = time.monotonic() + LOCK_WAIT_S
    while time.monotonic() < deadline:
        holder = _read_holder(path)
        ours = holder.get("launch") == launch and holder.get("host") == host
        if ours and _pid_alive(holder.get("pid")):
            return
        time.sleep(LOCK_POLL_S)
    raise ConfigError(
        f"local rank 0 did not take the run directory lock {path} within {LOCK_WAIT_S:.0f} s"
    )


def _prepare(run_dir: Path, resume: bool, overwrite: bool) -> list[str]:
    """Refuse a fresh start over checkpoints (unless overwrite: delete them), remove partial
    checkpoints, and make sure the run has its run id (a new one for a fresh start)."""
    checkpoints = run_dir / "checkpoints"
    notes = [f"removed partial checkpoint {p}" for p in remove_partial_checkpoints(checkpoints)]
    existing = latest_checkpoint(checkpoints)
    if not resume and existing is not None:
        if not overwrite:
            raise ConfigError(
                f"run.run_dir {run_dir} holds checkpoints of an earlier run (newest "
                f"{existing.name}): continue it with --resume, start over with --overwrite "
                "(deletes its checkpoints and metrics), or choose another run.run_dir"
            )
        shutil.rmtree(checkpoints)
        notes.append(f"--overwrite: removed the earlier run's checkpoints under {checkpoints}")
    if overwrite:
        for name in METRICS_FILES:
            if (run_dir / name).exists():
                (run_dir / name).unlink()
                notes.append(f"--overwrite: removed the earlier run's {name}")
    elif not resume:
        notes += _keep_earlier_metrics(run_dir)
    if not resume or read_run_id(run_dir) is None:
        run_id = uuid.uuid4().hex[:12]
        temporary = run_dir / f".{RUN_ID_FILE}.{os.getpid()}"
        temporary.write_text(run_id + "\n")
        temporary.replace(run_dir / RUN_ID_FILE)
    return notes


def _keep_earlier_metrics(run_dir: Path) -> list[str]:
    """A fresh start where an earlier run left metrics but no checkpoint (it stopped or
    failed before its first one): its files move aside under its run id, so the new run's
    metrics.jsonl holds only the new run. Returns what moved, for the log."""
    earlier = read_run_id(run_dir) or time.strftime("%Y%m%d-%H%M%S")
    notes = []
    for name in METRICS_FILES:
        source = run_dir / name
        if not source.exists():
            continue
        kept = run_dir / name.replace("metrics", f"metrics.{earlier}", 1)
        source.replace(kept)
        notes.append(
            f"{name} of the earlier run in this directory (no checkpoint) kept as {kept.name}"
        )
    return notes
