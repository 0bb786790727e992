"""Liveness by progress and prompt exits: hung ranks are named and end the run, start-up
signals end every rank at once.

The ring checks (progress per phase, a watchdog that names its own stuck main thread)
run on an in-process ring pair; the end-to-end cases use real torchrun runs of the
embedded default on CPU: a SIGSTOPped target, a drafter whose main thread blocks (SIGUSR1
through ringtrain/testing/spin_hook, its heartbeat thread alive), and SIGTERM while every rank waits
in start-up. Every wait polls processes or files against a deadline.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from ringtrain.ring import PeerDied, RankHung, Ring
from ringtrain.ring.watch import HEARTBEAT_INTERVAL_S
from ringtrain.testing import SPIN_HOOK
from ringtrain.trainer import phases
from tests.helpers import ring_workers as rw
from tests.helpers.launcher import (
    RUN_TIMEOUT_S,
    launch,
    pid_alive,
    rank_log,
    ring_reader,
    shm_entries,
    stop_all,
    wait_for_step,
    wait_gone,
)

ALLOWANCE_S = 2.0  # ring.progress_timeout_s of the in-process pairs
# The watchdog sees a hang within the allowance, one heartbeat sample of the main thread and
# one of its rounds (the ring's wait_timeout_s); the rest is a busy 2-core machine's margin.
DETECT_S = ALLOWANCE_S + HEARTBEAT_INTERVAL_S + rw.make_spec("t", 1, 1).wait_timeout_s + 10.0
POLL_S = 0.05


def _pair(progress_timeout_s: float, startup_timeout_s: float) -> tuple[Ring, Ring]:
    spec = dataclasses.replace(
        rw.make_spec(rw.run_id(), producers=1, consumers=1),
        progress_timeout_s=progress_timeout_s,
        startup_timeout_s=startup_timeout_s,
    )
    first, second = Ring.create(spec, 0, "cpu"), Ring.attach(spec.run_id, 1, "cpu")
    first.own_row.describe_work(phases.WORK["target"])
    second.own_row.describe_work(phases.WORK["drafter"])
    return first, second


def _age_progress(ring: Ring, index: int, seconds: float) -> None:
    """Make rank `index` look silent and idle for `seconds` (its heartbeat thread's next
    sample of this test's main thread may refresh the activity again)."""
    then = time.monotonic_ns() - int(seconds * 1e9)
    for field in ("progress_ns", "active_ns", "still_ns"):
        ring.control.rank[field][index] = then


def test_a_rank_without_progress_is_hung_after_its_phase_allowance() -> None:
    target, drafter = _pair(progress_timeout_s=ALLOWANCE_S, startup_timeout_s=30.0)
    try:
        target.own_row.set_phase(phases.LOADING_TARGET)
        _age_progress(target, 0, 10.0)
        drafter.check_peers()  # loading may take 30 s: not hung after 10
        assert target.snapshot().ranks[0].status == "attached"
        target.own_row.record_progress(1)
        _age_progress(target, 0, 10.0)
        with pytest.raises(RankHung, match=r"rank 10 \(target, pid \d+\) is hung: no progress"):
            drafter.check_peers()
        snapshot = drafter.snapshot()
        hung = snapshot.ranks[0]
        assert hung.status == "hung" and hung.doing == "producing batches"
        assert snapshot.fatal.startswith("rank 10 (target) is hung: no progress for 10 s")
        assert "ring.progress_timeout_s" in snapshot.fatal
    finally:
        drafter.close()
        target.close()


def test_the_watchdog_names_its_own_stuck_main_thread() -> None:
    target, drafter = _pair(progress_timeout_s=ALLOWANCE_S, startup_timeout_s=30.0)
    try:
        fired: list[PeerDied] = []
        done = threading.Event()

        def on_dead(exc: PeerDied) -> None:
            fired.append(exc)
            done.set()

        target.own_row.record_progress(1)
        _age_progress(target, 0, 5.0)
        target.start_watchdog(on_dead)
        assert done.wait(DETECT_S)
        assert isinstance(fired[0], RankHung) and fired[0].rank == 10
        assert "while producing batches" in str(fired[0])
        assert "its main thread is blocked at" in str(fired[0])
    finally:
        drafter.close(clean=False)
        target.close(clean=False)


# ---- whole runs ----------------------------------------------------------------------------

# A hung rank's run must be gone within its allowance (the progress and heartbeat timeouts
# each run sets) and this margin for the peers to see it and every rank to exit.
END_AFTER_HANG_MARGIN_S = 15.0
# torchrun passes a SIGTERM on to its workers and SIGKILLs those left after its shutdown
# timeout (30 s unless --shutdown-timeout says otherwise): ranks that leave at once, as
# start-up promises, are gone well within half of it.
TORCHRUN_SHUTDOWN_TIMEOUT_S = 30.0
END_AFTER_STARTUP_SIGNAL_S = TORCHRUN_SHUTDOWN_TIMEOUT_S / 2


def _hang_ends_run(
    tmp_path: Path, targets: int, drafters: int, timeout_s: int, fault: signal.Signals
) -> str:
    """Start a run with progress and heartbeat allowances of `timeout_s`, send `fault` to
    its last rank after step 2, and return the output once the whole run ended in time,
    naming that rank, with /dev/shm clean and no rank exiting cleanly."""
    name = f"{fault.name.lower()}{os.getpid()}"
    launched = launch(
        tmp_path / "run",
        targets,
        drafters,
        [
            "run.max_steps=1000",
            "run.log_every=1",
            "run.checkpoint_every=0",
            "run.eval_every=0",
            f'run.name="{name}"',
            f"ring.progress_timeout_s={timeout_s}",
            f"ring.heartbeat_timeout_s={timeout_s}",
        ],
    )
    try:
        wait_for_step(launched.proc, launched.run_dir, 2, launched.text)
        reader = ring_reader(name)
        try:
            ranks = {r.rank: r for r in reader.snapshot().ranks}
        finally:
            reader.close()
        victim = ranks[targets - 1 if fault == signal.SIGSTOP else targets + drafters - 1]
        os.kill(victim.pid, fault)
        wait_gone([r.pid for r in ranks.values()], timeout_s + END_AFTER_HANG_MARGIN_S)
        launched.proc.wait(END_AFTER_HANG_MARGIN_S)
    finally:
        stop_all(launched)
    output = launched.text()
    assert launched.proc.returncode != 0, output[-3000:]
    named = f"rank {victim.rank} ({victim.label}, pid {victim.pid})"
    assert named in output, f"the terminal does not name {named}:\n{output[-3000:]}"
    for rank in ranks.values():
        assert "exiting with code 0" not in rank_log(launched.run_dir, rank.rank, rank.label)
    assert shm_entries(name) == []
    return output


@pytest.mark.slow
def test_a_stopped_target_ends_the_run_naming_it(tmp_path: Path) -> None:
    output = _hang_ends_run(tmp_path, 2, 1, timeout_s=8, fault=signal.SIGSTOP)  # target 1
    # While it was silent the drafter trained on the other target's batches: it said so.
    assert "target rank 1 silent" in output, output[-3000:]


@pytest.mark.slow
def test_a_stuck_main_thread_ends_the_run_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([str(SPIN_HOOK), os.environ.get("PYTHONPATH", "")])
    )
    output = _hang_ends_run(tmp_path, 1, 1, timeout_s=6, fault=signal.SIGUSR1)  # the drafter
    assert "is hung: no progress" in output, output[-3000:]


def _lock_waiters(path: Path) -> list[int]:
    """Pids of processes blocked on a POSIX lock of `path` (from /proc/locks)."""
    inode = os.stat(path).st_ino
    waiters = []
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if "->" in fields and int(fields[-3].rsplit(":", 1)[1]) == inode:
            waiters.append(int(fields[fields.index("->") + 4]))
    return waiters


@pytest.mark.slow
def test_sigterm_during_start_up_ends_every_rank_at_once(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    lock_path = run_dir / "builtin" / ".lock"
    lock_path.parent.mkdir(parents=True)
    name = f"early{os.getpid()}"
    with lock_path.open("w") as lock:
        # Every rank blocks in start-up, building the built-in inputs under this lock.
        fcntl.lockf(lock, fcntl.LOCK_EX)
        launched = launch(run_dir, 2, 1, [f'run.name="{name}"'])
        try:
            deadline = time.monotonic() + RUN_TIMEOUT_S
            while len(ranks := _lock_waiters(lock_path)) < 3:
                assert launched.proc.poll() is None, launched.text()[-3000:]
                assert time.monotonic() < deadline, "the ranks never reached the lock"
                time.sleep(POLL_S)
            launched.proc.send_signal(signal.SIGTERM)
            took = wait_gone(ranks, END_AFTER_STARTUP_SIGNAL_S)
            launched.proc.wait(END_AFTER_STARTUP_SIGNAL_S)
        finally:
            stop_all(launched)
    assert not any(pid_alive(pid) for pid in ranks)
    logs = [p.read_text() for p in (run_dir / "logs").glob("rank*.log")]
    assert len(logs) == 3 and all("SIGTERM during start-up: leaving now" in log for log in logs), (
        f"{took:.1f} s\n" + launched.text()[-3000:]
    )
    assert shm_entries(name) == []
