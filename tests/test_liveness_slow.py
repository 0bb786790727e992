"""Slow is not hung: a rank whose main thread works past its progress allowance keeps
running, one blocked in one place is named hung by itself, and a stop during a slow
step waits for it.

The sampler and the verdicts run on real threads and rank-table rows; the end-to-end
cases are real ringtrain-launch runs of the embedded default on CPU (1 target + 2
drafters) with tests/helpers/stall_hook on the PYTHONPATH: SIGUSR1 makes a drafter's
main thread compute for three allowances, SIGUSR2 blocks it on a lock for good; or with
ringtrain.testing's spin hook, whose SIGUSR2 blocks it at the end of its next wait on the
other drafter. Every wall-clock bound follows from the configured allowance; waits poll
files or processes.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from ringtrain.ring import control as cb
from ringtrain.ring import phases
from ringtrain.ring.errors import PeerDied, RankHung
from ringtrain.ring.liveness import (
    PeerWait,
    ThreadActivity,
    ThreadSampler,
    monotonic_ns,
    own_identity,
    process_alive,
    process_start_time,
    process_state,
    runs_torch_code,
    thread_cpu_s,
    waiting_on_peers,
)
from ringtrain.ring.spec import RingSpec
from ringtrain.ring.watch import Watch, heartbeat_interval_s
from ringtrain.testing import SPIN_HOOK
from tests.helpers import ring_workers as rw
from tests.helpers.launcher import (
    RUN_TIMEOUT_S,
    finish_launch,
    rank_row,
    run_env,
    start_launch,
    step_records,
    wait_for_step,
)

STALL_HOOK = Path(__file__).resolve().parent / "helpers" / "stall_hook"
POLL_S = 0.1
ALLOWANCE_S = 6  # ring.progress_timeout_s of the end-to-end runs
SLOW_S = 3 * ALLOWANCE_S  # how long the slowed drafter computes in one place


# ---- the sampler ------------------------------------------------------------------------


def _sampled(work, stop: threading.Event) -> list:
    """Start `work(stop)` in a thread, sample it twice a second apart, stop it."""
    ready = threading.Event()
    thread = threading.Thread(target=lambda: (ready.set(), work(stop)), daemon=True)
    thread.start()
    ready.wait()
    sampler = ThreadSampler(thread.ident, thread.native_id)
    samples = []
    for _ in range(2):
        stop.wait(1.0)
        samples.append(sampler.sample())
    stop.set()
    thread.join()
    return samples


def test_the_sampler_tells_a_computing_thread_from_a_blocked_one() -> None:
    def compute(stop: threading.Event) -> None:
        while not stop.is_set():
            sum(range(1000))

    busy = _sampled(compute, threading.Event())[-1]
    assert busy.busy and not busy.waits_on_peers
    blocked = _sampled(lambda stop: stop.wait(), threading.Event())[-1]
    assert not blocked.busy and not blocked.moved
    assert blocked.where.endswith(" in wait")  # threading.Event.wait


def test_a_wait_on_peers_is_marked_for_the_sampler() -> None:
    sampler = ThreadSampler(threading.get_ident(), threading.get_native_id())
    completed = sampler.sample().peer_wait.completed
    entered = monotonic_ns()
    with waiting_on_peers(3), waiting_on_peers(3):  # nested: the outer span counts
        inside = sampler.sample()
    assert inside.waits_on_peers and inside.peer_wait.since_ns >= entered
    assert inside.peer_wait == PeerWait(inside.peer_wait.since_ns, completed, 3)
    assert not inside.in_torch  # this test's own frame
    after = sampler.sample()
    assert not after.waits_on_peers and after.peer_wait.completed == completed + 1


def test_a_frame_of_torch_is_told_from_one_of_the_caller() -> None:
    callers = []
    torch.nn.Identity().apply(lambda _module: callers.append(sys._getframe(1)))
    assert callers[0].f_code.co_name == "apply"  # Module.apply's own frame, in torch
    assert runs_torch_code(callers[0])
    assert not runs_torch_code(sys._getframe())


def _line_of(thread: threading.Thread, code) -> int | None:
    """The line `thread` runs in its frame of `code` (None while that frame is not on its stack)."""
    frame = sys._current_frames().get(thread.ident)
    while frame is not None and frame.f_code is not code:
        frame = frame.f_back
    return frame.f_lineno if frame is not None else None


def test_a_blocked_thread_that_moved_to_another_line_of_one_function_has_moved() -> None:
    # Locks, not events: a thread blocked in Lock.acquire has no Python frame inside it, so
    # once it is on the line it announced, its stack cannot change until it is let go.
    first, second, stop = threading.Lock(), threading.Lock(), threading.Event()
    first.acquire()
    second.acquire()
    lines = []

    def two_waits() -> None:
        lines.append(sys._getframe().f_lineno + 1)
        first.acquire()
        lines.append(sys._getframe().f_lineno + 1)
        second.acquire()

    thread = threading.Thread(target=two_waits, daemon=True)
    thread.start()
    try:
        for index in range(2):  # poll until it waits on the line it announced
            while len(lines) <= index or _line_of(thread, two_waits.__code__) != lines[index]:
                stop.wait(0.01)
            if index == 0:
                sampler = ThreadSampler(thread.ident, thread.native_id)
                sampler.sample()
                assert not sampler.sample().moved  # still in the first wait
                first.release()
        # Blocked again, in the same function, one line further on.
        assert sampler.sample().moved
    finally:
        for gate in (first, second):
            if gate.locked():
                gate.release()
        thread.join()


def test_a_thread_s_cpu_time_counts_its_time_in_the_kernel() -> None:
    used, done = [], threading.Event()

    def read_zeros() -> None:  # reading /dev/zero is almost all system time
        with open("/dev/zero", "rb", buffering=0) as zeros:
            while time.thread_time() < 0.5:
                zeros.read(1 << 20)
        used.append(time.thread_time())
        done.wait()

    thread = threading.Thread(target=read_zeros, daemon=True)
    thread.start()
    try:
        while not used:
            done.wait(0.01)
        # The kernel's tick accounting splits the same total between user and system.
        assert thread_cpu_s(thread.native_id) == pytest.approx(used[0], abs=0.05)
    finally:
        done.set()
        thread.join()
    # A joined thread's kernel task may outlive join() for a moment, so the id of a thread
    # that is gone for certain is that of a child process already reaped: never a task here.
    with subprocess.Popen(["true"]) as reaped:
        assert reaped.wait() == 0
    assert thread_cpu_s(reaped.pid) is None


def test_a_process_is_known_by_its_pid_and_start_time_whatever_its_name(tmp_path: Path) -> None:
    named = tmp_path / "a) b (c"  # /proc/<pid>/stat shows the name between parentheses
    named.symlink_to(shutil.which("sleep"))
    child = subprocess.Popen([str(named), "600"])
    try:
        started = process_start_time(child.pid)
        assert started >= process_start_time(os.getpid())  # started after this process
        # Running, sleeping, or in a disk wait (exec still reading the program under load).
        assert process_state(child.pid) in ("R", "S", "D")
        assert process_alive(child.pid, started)
        assert not process_alive(child.pid, started - 1)  # another process under that pid
    finally:
        child.kill()
        child.wait()
    assert not process_alive(child.pid, started)
    assert process_state(child.pid) == ""


# ---- the verdicts ----------------------------------------------------------------------


def _spec() -> RingSpec:
    spec = rw.make_spec("liveness", producers=1, consumers=1)
    return dataclasses.replace(spec, progress_timeout_s=10.0, startup_timeout_s=100.0)


def _row(spec: RingSpec, progress_s: float, active_s: float, still_s: float, busy: bool):
    """An attached, working rank-table row of this process: its last progress, activity
    and stack move that many seconds ago, its main thread busy or not at a named place."""
    row = np.zeros(1, dtype=cb.rank_dtype(spec.slots_per_producer))[0]
    now = monotonic_ns()
    row["status"], row["phase"], row["pid"] = cb.ATTACHED, phases.WORKING, os.getpid()
    row["progress_ns"] = now - int(progress_s * 1e9)
    row["active_ns"] = now - int(active_s * 1e9)
    row["still_ns"] = now - int(still_s * 1e9)
    row["cpu_busy"] = int(busy)
    cb.put_bytes(row, "doing", b"training")
    cb.put_bytes(row, "where", b"drafter/model.py:150 in forward")
    return row, now


def test_a_working_rank_past_its_allowance_is_slow_not_hung() -> None:
    spec = _spec()
    row, now = _row(spec, progress_s=60.0, active_s=1.0, still_s=40.0, busy=True)
    assert phases.hang_reason(row, now, spec) is None
    slow = phases.slow_reason(row, now, spec)
    assert slow is not None and slow.startswith("is slow, not hung: no progress for 60 s")
    assert "ring.progress_timeout_s = 10 s" in slow and "model.py:150" in slow


def test_a_blocked_rank_is_hung_and_says_where() -> None:
    spec = _spec()
    row, now = _row(spec, progress_s=30.0, active_s=30.0, still_s=30.0, busy=False)
    reason = phases.hang_reason(row, now, spec)
    assert reason is not None and reason.startswith("is hung: no progress for 30 s")
    assert "blocked at drafter/model.py:150 in forward, using no CPU" in reason
    assert phases.slow_reason(row, now, spec) is None


def test_cpu_use_in_one_place_counts_as_work_up_to_the_startup_allowance() -> None:
    spec = _spec()
    row, now = _row(spec, progress_s=50.0, active_s=50.0, still_s=50.0, busy=False)
    busy = ThreadActivity(moved=False, busy=True, peer_wait=PeerWait(), where="x.py:1")
    phases.record_activity(row, busy, now, spec)
    assert phases.hang_reason(row, now, spec) is None  # 50 s in one place, using the CPU
    row["still_ns"] = now - int(150e9)  # past startup_timeout_s (100 s) without moving
    row["active_ns"] = now - int(50e9)
    phases.record_activity(row, busy, now, spec)
    reason = phases.hang_reason(row, now, spec)
    assert reason is not None and "has used the CPU at x.py:1 for 150 s without moving" in reason


def test_only_an_attached_rank_is_judged_slow_or_hung() -> None:
    spec = _spec()
    row, now = _row(spec, progress_s=60.0, active_s=1.0, still_s=40.0, busy=True)
    assert phases.slow_reason(row, now, spec) is not None
    for status in (cb.FINISHED, cb.CLOSED, cb.FAILED):  # a finished target drains, say
        row["status"] = status
        assert phases.slow_reason(row, now, spec) is None
    row, now = _row(spec, progress_s=30.0, active_s=30.0, still_s=30.0, busy=False)
    assert phases.hang_reason(row, now, spec) is not None
    for status in (cb.FINISHED, cb.CLOSED, cb.FAILED):
        row["status"] = status
        assert phases.hang_reason(row, now, spec) is None


def test_a_wait_on_peers_counts_as_work_while_it_lasts() -> None:
    spec = _spec()
    row, now = _row(spec, progress_s=50.0, active_s=50.0, still_s=50.0, busy=False)
    entered = now - int(40e9)
    in_wait = ThreadActivity(
        moved=False,
        busy=False,
        peer_wait=PeerWait(entered, 3, 2),
        where="dist.py:9 in wait",
        in_torch=True,
    )
    phases.record_activity(row, in_wait, now, spec)
    recorded = ("peer_wait_ns", "peer_waits_done", "peer_group", "in_torch")
    assert tuple(int(row[key]) for key in recorded) == (entered, 3, 2, 1)
    assert phases.where(row) == "dist.py:9 in wait"
    assert phases.hang_reason(row, now, spec) is None  # still and idle, but it waits on peers
    # The wait ended and the thread blocks elsewhere: 20 s later it is hung.
    later = now + int(20e9)
    left = ThreadActivity(moved=False, busy=False, peer_wait=PeerWait(0, 4, 0), where="x.py:1")
    phases.record_activity(row, left, later, spec)
    reason = phases.hang_reason(row, later, spec)
    assert reason is not None and "blocked at x.py:1, using no CPU for 20 s" in reason


def test_a_moved_stack_starts_the_count_of_cpu_use_in_one_place_again() -> None:
    spec = _spec()
    row, now = _row(spec, progress_s=50.0, active_s=50.0, still_s=150.0, busy=True)
    moved = ThreadActivity(moved=True, busy=True, peer_wait=PeerWait(), where="x.py:2")
    phases.record_activity(row, moved, now, spec)
    assert int(row["still_ns"]) == now
    # 90 s more of CPU use in the new place: within startup_timeout_s (100 s), so working,
    # although 240 s have passed since the place it computed in before.
    later = now + int(90e9)
    busy = ThreadActivity(moved=False, busy=True, peer_wait=PeerWait(), where="x.py:2")
    phases.record_activity(row, busy, later, spec)
    assert int(row["active_ns"]) == later
    assert phases.hang_reason(row, later, spec) is None


def test_a_stopped_process_is_named_stopped_not_blocked() -> None:
    spec = _spec()
    child = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"])
    try:
        os.kill(child.pid, signal.SIGSTOP)
        os.waitpid(child.pid, os.WUNTRACED)  # returns once the kernel has stopped it
        row, now = _row(spec, progress_s=30.0, active_s=30.0, still_s=30.0, busy=False)
        row["pid"], row["heartbeat_ns"] = child.pid, now - int(12e9)
        reason = phases.hang_reason(row, now, spec)
    finally:
        child.kill()
        child.wait()
    assert reason is not None and reason.startswith(
        "stopped beating (heartbeat lost 12.0 s ago: its process is stopped), "
        "no progress for 30 s while training"
    ), reason


def _waiting_group(
    done: tuple[int, ...], waited_s: tuple[float, ...], members: int | None = None
) -> tuple[np.ndarray, int, RingSpec]:
    """The rank table of 1 target + one drafter per entry of `done` (2 unless told), the
    drafters all blocked in a wait on each other (`done` waits completed, the current one
    entered `waited_s` ago, no progress for 40 s, stacks still in torch's code, no CPU in
    use; a group of `members`, all of them by default): what their heartbeat threads
    record in a deadlock."""
    members = len(done) if members is None else members
    spec = dataclasses.replace(
        rw.make_spec("deadlock", producers=1, consumers=len(done)),
        progress_timeout_s=10.0,
        startup_timeout_s=100.0,
    )
    ranks = np.zeros(spec.num_ranks, dtype=cb.rank_dtype(spec.slots_per_producer))
    now = monotonic_ns()
    for index, row in enumerate(ranks):
        row["status"], row["phase"], row["pid"] = cb.ATTACHED, phases.WORKING, os.getpid()
        row["progress_ns"] = row["still_ns"] = now - int(40e9)
        row["active_ns"] = now  # a wait on peers counts as working
        cb.put_bytes(row, "doing", b"training")
        cb.put_bytes(row, "where", f"drafter/step.py:{index} in reduce".encode())
    ranks[0]["progress_ns"] = now  # the target waits on the full ring
    for index, (count, waited) in enumerate(zip(done, waited_s, strict=True), start=1):
        ranks[index]["peer_wait_ns"] = now - int(waited * 1e9)
        ranks[index]["peer_waits_done"], ranks[index]["peer_group"] = count, members
        ranks[index]["in_torch"] = 1
    return ranks, now, spec


def test_a_group_that_waits_on_itself_names_the_rank_behind() -> None:
    ranks, now, spec = _waiting_group(done=(7, 6), waited_s=(20.0, 30.0))
    assert all(phases.hang_reason(row, now, spec) is None for row in ranks)  # each "works"
    index, reason = phases.deadlock(ranks, now, spec)
    assert index == 2, reason
    assert reason.startswith("is hung: it and the other 1 rank(s) of its group wait on each")
    assert "still in its wait #7 on them, which the others have left" in reason
    assert "blocked at drafter/step.py:2 in reduce for 30 s" in reason
    assert "(the others: rank 11 at drafter/step.py:1 in reduce)" in reason


def test_at_equal_counts_the_last_to_enter_the_shared_wait_is_named() -> None:
    ranks, now, spec = _waiting_group(done=(6, 6), waited_s=(30.0, 20.0))
    index, reason = phases.deadlock(ranks, now, spec)
    assert index == 2 and "entered the wait they share last" in reason


def test_at_equal_counts_a_rank_blocked_in_its_own_code_is_named_before_the_last_to_enter() -> None:
    # Rank 12 entered the backward first and blocked in its own code there; rank 11 entered
    # later, computed its part and waits in torch's reduction for rank 12's gradients.
    ranks, now, spec = _waiting_group(done=(6, 6), waited_s=(20.0, 30.0))
    ranks[2]["in_torch"] = 0
    index, reason = phases.deadlock(ranks, now, spec)
    assert index == 2, reason
    assert "it is blocked in its own code inside the wait, the others in torch's" in reason


def test_a_wait_on_a_working_or_absent_peer_is_no_deadlock() -> None:
    ranks, now, spec = _waiting_group(done=(7, 6), waited_s=(20.0, 30.0))
    assert phases.deadlock(ranks, now, spec) is not None
    ranks[1]["cpu_busy"] = 1  # it computes (for less than the start-up allowance)
    assert phases.deadlock(ranks, now, spec) is None
    ranks[1]["cpu_busy"], ranks[1]["still_ns"] = 0, now  # its stack moves
    assert phases.deadlock(ranks, now, spec) is None
    ranks, now, spec = _waiting_group(done=(7, 6), waited_s=(5.0, 30.0))  # 5 s: allowed
    assert phases.deadlock(ranks, now, spec) is None
    ranks, now, spec = _waiting_group(done=(7, 6), waited_s=(20.0, 30.0), members=4)
    assert phases.deadlock(ranks, now, spec) is None  # two of the group are on other hosts
    ranks, now, spec = _waiting_group(done=(7, 6), waited_s=(20.0, 30.0))
    ranks[1]["peer_wait_ns"] = 0  # not in a wait: judged by its own row
    assert phases.deadlock(ranks, now, spec) is None
    ranks, now, spec = _waiting_group(done=(7, 6), waited_s=(20.0, 30.0))
    ranks[1]["progress_ns"] = now - int(5e9)  # it made progress within its allowance
    assert phases.deadlock(ranks, now, spec) is None


def test_cpu_use_in_one_place_inside_a_peer_wait_counts_up_to_the_startup_allowance() -> None:
    ranks, now, spec = _waiting_group(done=(7, 6), waited_s=(20.0, 30.0))
    ranks[1]["cpu_busy"] = 1
    ranks[1]["still_ns"] = now - int(90e9)  # within startup_timeout_s (100 s): computing
    assert phases.deadlock(ranks, now, spec) is None
    ranks[1]["still_ns"] = now - int(150e9)  # past it: a loop that never ends
    assert phases.deadlock(ranks, now, spec) is not None


def test_in_a_group_of_three_the_rank_behind_is_told_by_every_other_rank() -> None:
    # Rank 12 and rank 13 both still have wait #7 to leave; 13 entered it last.
    ranks, now, spec = _waiting_group(done=(7, 6, 6), waited_s=(20.0, 30.0, 25.0))
    index, reason = phases.deadlock(ranks, now, spec)
    assert index == 3 and "entered the wait they share last" in reason, reason
    assert "the other 2 rank(s) of its group" in reason
    # Only rank 13 is still in wait #7: both others have left it.
    ranks, now, spec = _waiting_group(done=(7, 7, 6), waited_s=(20.0, 30.0, 25.0))
    index, reason = phases.deadlock(ranks, now, spec)
    assert index == 3 and "still in its wait #7 on them, which the others have left" in reason


# ---- one rank's checks of its ring (watch.py) --------------------------------------------


def _watched(spec: RingSpec) -> cb.ControlBlock:
    """A control block of `spec` in anonymous memory (rw.anonymous_control_block) whose
    ranks are this process, attached, working and beating now."""
    block = rw.anonymous_control_block(spec)
    now = monotonic_ns()
    ranks = block.ranks
    ranks["status"], ranks["phase"] = cb.ATTACHED, phases.WORKING
    ranks["pid"], ranks["start_time"] = own_identity()
    for name in ("heartbeat_ns", "progress_ns", "active_ns", "still_ns"):
        ranks[name] = now
    return block


def test_the_heartbeat_beats_four_times_per_heartbeat_timeout_at_most_once_a_second() -> None:
    assert heartbeat_interval_s(dataclasses.replace(_spec(), heartbeat_timeout_s=2.0)) == 0.5
    assert heartbeat_interval_s(dataclasses.replace(_spec(), heartbeat_timeout_s=30.0)) == 1.0


def test_an_aborted_ring_is_blamed_on_the_rank_that_aborted_it_by_the_others_only() -> None:
    spec = _spec()
    block = _watched(spec)
    block.closing[...], block.header["closing_rank"] = 1, 0
    Watch(spec, block, 0).check_peers()  # its own abort: nothing to blame on a peer
    with pytest.raises(PeerDied, match=r"rank 10 \(target.*aborted the ring"):
        Watch(spec, block, 1).check_peers()


def test_a_group_held_up_by_one_rank_is_named_by_that_rank_itself_and_by_its_peer() -> None:
    spec = _spec()  # allowance 10 s
    block = _watched(spec)
    ranks, long_ago = block.ranks, monotonic_ns() - 20 * 10**9
    ranks["peer_wait_ns"], ranks["peer_group"] = long_ago, 2
    ranks["progress_ns"], ranks["still_ns"] = long_ago, long_ago
    ranks["peer_waits_done"] = [3, 4]  # rank 10 is still in the wait rank 11 has left
    Watch(spec, block, 0).check_peers()  # it is not its own peer
    Watch(spec, block, 1).check_self()
    for check in (Watch(spec, block, 0).check_self, Watch(spec, block, 1).check_peers):
        with pytest.raises(RankHung, match=r"rank 10 .*is hung: it and the other 1 rank"):
            check()


def test_a_slow_rank_says_so_once(caplog: pytest.LogCaptureFixture) -> None:
    spec = _spec()
    block = _watched(spec)
    block.ranks["progress_ns"][0] = monotonic_ns() - 20 * 10**9  # working, past 10 s
    watch = Watch(spec, block, 0)
    with caplog.at_level("WARNING", logger="ringtrain.ring.watch"):
        watch.note_slow_self()
        watch.note_slow_self()
    assert sum("is slow, not hung" in r.getMessage() for r in caplog.records) == 1


def test_a_rank_that_closed_is_not_killed_however_old_its_heartbeat() -> None:
    spec = _spec()
    block = _watched(spec)
    child = subprocess.Popen([shutil.which("sleep"), "600"])
    try:
        row = block.ranks[1]
        row["pid"], row["start_time"] = child.pid, process_start_time(child.pid)
        row["status"], row["heartbeat_ns"] = cb.CLOSED, monotonic_ns() - 60 * 10**9
        block.closing[...], block.header["closing_rank"] = 1, 1
        with pytest.raises(PeerDied, match="aborted the ring"):
            Watch(spec, block, 0).check_peers()
        # A frozen rank that had not closed would be marked failed, then killed.
        assert int(row["status"]) == cb.CLOSED and int(row["error_len"]) == 0
        assert child.poll() is None
    finally:
        child.kill()
        child.wait()


# ---- whole runs ------------------------------------------------------------------------


def _launch(
    tmp_path: Path,
    name: str,
    overrides: list[str],
    launcher_flags: tuple[str, ...] = (),
    hook: Path = STALL_HOOK,
) -> tuple[subprocess.Popen, Path]:
    """ringtrain-launch of the embedded default (1 target + 2 drafters) with torchrun's
    `launcher_flags`, `hook` (a sitecustomize's directory) first on every rank's
    PYTHONPATH, its console in a file."""
    env = run_env()
    env["PYTHONPATH"] = os.pathsep.join([str(hook), env.get("PYTHONPATH", "")])
    env["STALL_HOOK_BUSY_S"] = str(SLOW_S)
    overrides = [
        "run.max_steps=1000",
        "run.log_every=1",
        "run.checkpoint_every=0",
        "run.eval_every=0",
        f'run.name="{name}"',
        f"ring.progress_timeout_s={ALLOWANCE_S}",
        *overrides,
    ]
    output = tmp_path / "console.txt"
    return start_launch(
        tmp_path / "run", 1, 2, overrides, env=env, output=output, launcher_flags=launcher_flags
    )


def _drafter(name: str, proc: subprocess.Popen, run_dir: Path, output: Path):
    """The last drafter of the live run `name`, once it trained two steps."""
    wait_for_step(proc, run_dir, 2, lambda: output.read_text(errors="replace"))
    return rank_row(name, -1)


def _wait_for(condition, timeout_s: float, proc: subprocess.Popen, output: Path, what: str):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert proc.poll() is None, f"the run ended before {what}:\n{output.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no {what}:\n{output.read_text()[-3000:]}"
        time.sleep(POLL_S)


@pytest.mark.slow
def test_a_slow_step_is_not_hung_and_a_stop_during_it_waits_and_exits_0(tmp_path: Path) -> None:
    """A drafter computes three allowances in one place: it says it is slow, nobody calls it
    hung; SIGTERM to the launcher meanwhile waits for the step, checkpoints, exits 0,
    although the step takes far longer than torchrun's --shutdown-timeout (1 s here)."""
    name = f"slow{os.getpid()}"
    proc, output = _launch(tmp_path, name, [], launcher_flags=("--shutdown-timeout", "1"))
    run_dir = tmp_path / "run"
    try:
        victim = _drafter(name, proc, run_dir, output)
        log = run_dir / "logs" / f"rank{victim.rank}-drafter.log"
        os.kill(victim.pid, signal.SIGUSR1)
        _wait_for(
            lambda: "is slow, not hung" in log.read_text(),
            SLOW_S + RUN_TIMEOUT_S / 10,
            proc,
            output,
            "note that the drafter is slow",
        )
        before = step_records(run_dir)[-1]["step"]
        proc.send_signal(signal.SIGTERM)  # while the drafter still computes
        text = finish_launch(proc, output, SLOW_S + RUN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, text[-4000:]
    assert "is hung" not in text, text[-4000:]
    last = text.strip().splitlines()[-1]
    assert last.startswith("ringtrain: stopped at step "), text[-4000:]
    assert "(SIGTERM), checkpoint " in last and last.endswith("--resume"), last
    assert step_records(run_dir)[-1]["step"] >= before  # the slow step completed


@pytest.mark.slow
def test_a_blocked_drafter_names_itself_hung_in_the_last_line(tmp_path: Path) -> None:
    name = f"stuck{os.getpid()}"
    proc, output = _launch(tmp_path, name, [])
    run_dir = tmp_path / "run"
    try:
        victim = _drafter(name, proc, run_dir, output)
        os.kill(victim.pid, signal.SIGUSR2)
        text = finish_launch(proc, output, ALLOWANCE_S + RUN_TIMEOUT_S / 5)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0, text[-4000:]
    last = text.strip().splitlines()[-1]
    # Blocked between steps, it made no progress; blocked inside its part of the gradient
    # reduction (its peer then waits on it), the group's deadlock names it as the one behind.
    hung = f"rank {victim.rank} (drafter, pid {victim.pid}) is hung: "
    assert hung + "no progress" in last or hung + "it and the other 1 rank(s)" in last, text
    assert "blocked at" in last and "stall_hook/sitecustomize.py" in last, last
    assert last.endswith(f"(its log: {run_dir / 'logs' / f'rank{victim.rank}-drafter.log'})")


@pytest.mark.slow
def test_a_drafter_stuck_inside_a_wait_on_its_peer_is_named_hung(tmp_path: Path) -> None:
    """The drafter blocks at the end of a wait on the other drafter (after its part of the
    reduction): the other one goes on and waits for it in the next one. Each counts as
    waiting on its peers, so neither row alone is hung; the pair is, and the one behind
    is named in the last line."""
    name = f"peerwait{os.getpid()}"
    proc, output = _launch(tmp_path, name, [], hook=SPIN_HOOK)
    run_dir = tmp_path / "run"
    try:
        victim = _drafter(name, proc, run_dir, output)
        os.kill(victim.pid, signal.SIGUSR2)
        text = finish_launch(proc, output, 2 * ALLOWANCE_S + RUN_TIMEOUT_S / 5)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0, text[-4000:]
    last = text.strip().splitlines()[-1]
    named = f"rank {victim.rank} (drafter, pid {victim.pid}) is hung: it and the other 1 rank"
    assert named in last, text[-4000:]
    assert "blocked at" in last and "spin_hook/sitecustomize.py" in last, last
