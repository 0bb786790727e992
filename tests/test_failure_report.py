"""How a failed run is reported and what it leaves: the rank that failed first, and no
shared-memory objects of dead rings.

The report's choice among the ranks' outcomes is checked on outcomes as ranks write
them; a target SIGSTOPped under ringtrain-launch (a real CPU run of the embedded
default) must end with one last line naming it, its lost heartbeat and its log; the
objects of a ring whose creator was SIGKILLed go with `ringtrain-stat --clean`, those of
a live ring stay.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from ringtrain.ring import PeerDied, Ring
from ringtrain.trainer import outcome as outcomes
from ringtrain.trainer.outcome import (
    FAILED,
    OUTCOME_DIR_ENV,
    PEER_FAILED,
    STOPPED,
    Outcome,
    report_outcome,
)
from ringtrain.trainer.report import describe_end
from tests.helpers import ring_workers as rw
from tests.helpers.launcher import (
    RUN_TIMEOUT_S,
    pid_alive,
    rank_row,
    run_env,
    shm_entries,
    start_launch,
    wait_for_step,
)

REPO = Path(__file__).resolve().parents[1]
ALLOWANCE_S = 8  # the SIGSTOP run's heartbeat and progress allowances


def _echo(rank: int, culprit: int, wall: float, primary: bool, message: str) -> Outcome:
    return Outcome(
        rank,
        1,
        PEER_FAILED,
        message,
        wall=wall,
        culprit=culprit,
        culprit_log=f"logs/rank{culprit}.log",
        primary=primary,
    )


def test_the_report_names_the_rank_seen_failing_not_the_peers_that_echoed_it() -> None:
    outcomes = [
        _echo(0, 2, 3.0, True, "rank 2 (drafter) is hung"),  # the target saw it hang
        _echo(1, 0, 1.0, False, "rank 0 (target) aborted the ring"),  # an echo, earlier
        _echo(2, 0, 2.0, False, "rank 0 (target) aborted the ring"),  # the hung one, too
    ]
    assert describe_end(outcomes, 3, {0: 1, 1: 1, 2: 1}, "", "x") == (
        1,
        "rank 2 (drafter) is hung (its log: logs/rank2.log)",
    )
    # Echoes only: each culprit is followed to the report of the rank it blames.
    chain = [_echo(1, 0, 1.0, False, "rank 0 failed"), _echo(0, 2, 2.0, False, "rank 2 failed")]
    assert describe_end(chain, 3, {}, "", "x") == (1, "rank 2 failed (its log: logs/rank2.log)")


def test_a_rank_a_peer_killed_for_being_frozen_is_reported_as_frozen() -> None:
    seen = _echo(1, 0, 1.0, True, "rank 0 (target) stopped beating (heartbeat lost 9.0 s ago)")
    assert describe_end([seen], 2, {0: -9, 1: 1}, "", "x") == (
        137,
        "rank 0 (target) stopped beating (heartbeat lost 9.0 s ago); rank 0 was killed by "
        "SIGKILL (its log: logs/rank0.log)",
    )


def _stat(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "ringtrain.cli.stat", *args]
    return subprocess.run(
        command, cwd=REPO, env=run_env(), capture_output=True, text=True, timeout=RUN_TIMEOUT_S
    )


def test_stat_clean_removes_the_objects_of_a_ring_whose_creator_was_killed() -> None:
    dead, live = f"dead{uuid.uuid4().hex[:8]}", f"live{uuid.uuid4().hex[:8]}"
    create = (
        "import sys; from ringtrain.ring import Ring; from tests.helpers import ring_workers"
        " as rw; Ring.create(rw.make_spec(sys.argv[1], 1, 1), 0, 'cpu'); print('created',"
        " flush=True); sys.stdin.read()"
    )
    creator = subprocess.Popen(
        [sys.executable, "-c", create, dead],
        cwd=REPO,
        env=run_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    ring = Ring.create(rw.make_spec(live, 1, 1), 0, "cpu")
    try:
        assert creator.stdout.readline().strip() == "created"
        creator.send_signal(signal.SIGKILL)  # dies before the names are unlinked
        creator.wait(RUN_TIMEOUT_S)
        assert shm_entries(dead), "the killed creator's ring left no objects to clean"
        proc = _stat("--clean")
        assert proc.returncode == 0, proc.stderr
        assert f"objects of dead ring {dead}" in proc.stdout
        assert shm_entries(dead) == []
        assert shm_entries(live), "a live ring's objects were removed"
    finally:
        ring.close()
        if creator.poll() is None:
            creator.kill()
            creator.wait()


def test_a_process_reports_its_first_outcome_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The watchdog and the main thread may both report the failure they saw: the first
    report is the process's outcome, whole; the second neither replaces nor tears it."""
    monkeypatch.setenv(OUTCOME_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(outcomes._Report, "done", False)
    report_outcome(Outcome(3, 1, PEER_FAILED, "rank 0 stopped beating", primary=True))
    report_outcome(Outcome(3, 1, PEER_FAILED, "rank 0 failed"))
    [outcome] = outcomes.read_outcomes(tmp_path)
    assert outcome.message == "rank 0 stopped beating" and outcome.primary
    assert [path.name for path in tmp_path.iterdir()] == ["rank3.json"]


@pytest.mark.slow
def test_a_stopped_target_under_the_launcher_ends_with_its_lost_heartbeat(tmp_path: Path) -> None:
    name = f"frozen{os.getpid()}"
    run_dir = tmp_path / "run"
    overrides = ["run.max_steps=1000", "run.log_every=1", "run.eval_every=0"]
    overrides += ["run.checkpoint_every=0", f'run.name="{name}"']
    overrides += [
        f"ring.heartbeat_timeout_s={ALLOWANCE_S}",
        f"ring.progress_timeout_s={ALLOWANCE_S}",
    ]
    proc, output = start_launch(run_dir, 1, 2, overrides, output=tmp_path / "console.txt")
    stopped = None
    try:
        wait_for_step(proc, run_dir, 2, lambda: output.read_text(errors="replace"))
        target = rank_row(name, 0)
        os.kill(target.pid, signal.SIGSTOP)
        stopped = target.pid
        proc.wait(2 * ALLOWANCE_S + RUN_TIMEOUT_S / 5)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if stopped is not None and pid_alive(stopped):  # its own session: not in the group
            os.kill(stopped, signal.SIGKILL)
    text = output.read_text(errors="replace")
    assert proc.returncode != 0, text[-4000:]
    last = text.strip().splitlines()[-1]
    assert last.startswith(f"ringtrain: ring {name}-"), text[-4000:]
    assert f"rank 0 (target, pid {target.pid}) stopped beating (heartbeat lost" in last, last
    assert "its process is stopped" in last, last
    assert last.endswith(f"(its log: {run_dir / 'logs' / 'rank0-target.log'})"), last
    assert "Traceback" not in text, text[-4000:]
    assert shm_entries(name) == []


@pytest.mark.parametrize(
    ("reported", "local_ranks", "failures", "launcher_signal", "end"),
    [
        pytest.param(
            [], 3, {2: -9, 1: -15}, "",
            (128 + 15, "rank 1 was killed by SIGTERM without reporting an error"),
            id="of two ranks killed silently, the lower one",
        ),
        pytest.param(
            [], 2, {1: 3}, "", (3, "rank 1 exited with code 3 without reporting an error"),
            id="a silent failure's own exit code",
        ),
        pytest.param(
            [Outcome(0, 0, STOPPED, signal="SIGTERM")], 3, {}, "SIGTERM",
            (128 + 15, "SIGTERM: 2 of 3 ranks did not stop within torch's shutdown timeout and "
             "were killed (torchrun's --shutdown-timeout gives them longer); the newest "
             "complete checkpoint is kept"),
            id="ranks cut off at the launcher's shutdown timeout",
        ),
        pytest.param(
            [Outcome(0, 0, STOPPED, signal="SIGINT", step=5, checkpoint="ck/step_5")], 1, {},
            "SIGTERM", (0, "stopped at step 5 (SIGINT), checkpoint ck/step_5: resume with cmd"),
            id="the signal a rank took, not the launcher's",
        ),
        pytest.param(
            [Outcome(0, 0, STOPPED, signal="SIGTERM", step=3)], 1, {}, "SIGTERM",
            (0, "stopped at step 3 (SIGTERM) before any checkpoint: nothing to resume"),
            id="a stop before the first checkpoint",
        ),
    ],
)  # fmt: skip
def test_the_end_line_of_each_kind_of_end(
    reported: list[Outcome],
    local_ranks: int,
    failures: dict[int, int],
    launcher_signal: str,
    end: tuple[int, str],
) -> None:
    assert describe_end(reported, local_ranks, failures, launcher_signal, "cmd") == end


def test_an_outcome_is_stamped_when_reported_and_read_back_by_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each process of a launch writes its own file: the outcomes come back in rank order
    (10 after 2), each stamped with the time it was reported (the first failure is the
    earliest)."""
    monkeypatch.setenv(OUTCOME_DIR_ENV, str(tmp_path))
    before = time.time()
    for rank in (10, 2, 1):
        monkeypatch.setattr(outcomes._Report, "done", False)
        report_outcome(Outcome(rank, 0, STOPPED))
    after = time.time()
    read = outcomes.read_outcomes(tmp_path)
    assert [outcome.rank for outcome in read] == [1, 2, 10]
    assert all(before <= outcome.wall <= after for outcome in read)
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "rank1.json", "rank10.json", "rank2.json",
    ]  # fmt: skip


def test_under_plain_torchrun_a_report_writes_nothing_but_still_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(OUTCOME_DIR_ENV, raising=False)
    monkeypatch.setattr(outcomes._Report, "done", False)
    assert not outcomes.launched() and not outcomes.outcome_reported()
    report_outcome(Outcome(0, 1, FAILED, "boom"))
    assert outcomes.outcome_reported()


def test_a_peer_failure_points_at_the_culprits_log() -> None:
    died = PeerDied("rank 3 (drafter, pid 77) died", rank=3, label="drafter", primary=True)
    run_dir = Path("runs/x")
    outcome = outcomes.peer_failure(1, died, run_dir, run_dir / "logs" / "rank1-target.log")
    assert outcome == Outcome(
        1,
        1,
        PEER_FAILED,
        "rank 3 (drafter, pid 77) died",
        log="runs/x/logs/rank1-target.log",
        culprit=3,
        culprit_log="runs/x/logs/rank3-drafter.log",
        primary=True,
    )
    assert outcomes.peer_failure(1, died, run_dir, None).log is None
