"""ringtrain-launch (python -m ringtrain.launch): how a launch ends at the console.

Real launches of the embedded tiny run on CPU: a refusal is said once with exit code 2, a
stop (SIGTERM to the launcher, Ctrl-C to the whole process group) ends with one line and
no traceback, and a resumed session carries the run's held-out figure, tells its own
steps from the run's and has its target log the run's step. Waits poll files against a
deadline.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest

from ringtrain.checkpoint import latest_checkpoint, load_checkpoint
from ringtrain.launch import resume_command, split_arguments, torchrun_arguments
from ringtrain.trainer.outcome import FAILED, PEER_FAILED, REFUSED, STOPPED, Outcome
from ringtrain.trainer.report import describe_end
from tests.helpers.checkpoints import plant_torn_checkpoints
from tests.helpers.launcher import (
    RUN_TIMEOUT_S,
    eval_records,
    expected_batch_ids,
    finish_launch,
    rank_log,
    rank_row,
    run_env,
    shm_entries,
    start_launch,
    step_records,
    trained_batches,
    wait_for_step,
)

POLL_S = 0.1
TORCH_NOISE = ("Traceback", "SignalException", "ChildFailedError", "Logging error")
TORCH_LOG_LINE = re.compile(r"^[IWE]\d{4} ", re.MULTILINE)  # torch's launcher's log format


def _assert_quiet(text: str) -> None:
    for noise in TORCH_NOISE:
        assert noise not in text, f"{noise!r} on the console:\n{text[-4000:]}"
    assert not TORCH_LOG_LINE.search(text), f"torch's launcher logged:\n{text[-4000:]}"


def _launcher_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("ringtrain: ")]


def test_a_refusal_alike_on_every_rank_is_said_once_with_exit_code_2(tmp_path: Path) -> None:
    """... and the launcher leaves nothing in the temporary directory (torch's own made a
    torchelastic_* directory there at every launch)."""
    run_dir, temporary = tmp_path / "run", tmp_path / "tmp"
    temporary.mkdir()
    env = {**run_env(), "TMPDIR": str(temporary)}
    proc, output = start_launch(run_dir, 1, 2, ['target.path="/nonexistent/target"'], env=env)
    text = finish_launch(proc, output)
    assert proc.returncode == 2, text[-4000:]
    _assert_quiet(text)
    lines = _launcher_lines(text)
    assert len(lines) == 1 and "/nonexistent/target" in lines[0], text[-4000:]
    assert text.count("/nonexistent/target") == 1, text[-4000:]
    assert list(temporary.iterdir()) == []


def test_ctrl_c_during_start_up_ends_with_one_line_and_130(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc, output = start_launch(run_dir, 1, 2, ["run.max_steps=1000"])
    deadline = time.monotonic() + RUN_TIMEOUT_S
    logs = run_dir / "logs"
    while not (logs.is_dir() and len(list(logs.glob("rank*.log"))) == 3):
        assert proc.poll() is None, output.read_text()[-4000:]
        assert time.monotonic() < deadline, "the ranks never opened their logs"
        time.sleep(POLL_S)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
    text = finish_launch(proc, output)
    assert proc.returncode == 128 + signal.SIGINT, text[-4000:]
    _assert_quiet(text)
    assert _launcher_lines(text) == [
        "ringtrain: stopped by SIGINT during start-up: nothing trained yet, no checkpoint written"
    ], text[-4000:]
    assert "leaving now" not in text  # each rank's own notice stays in its log


@pytest.mark.slow
def test_sigterm_to_the_launcher_stops_cleanly_and_the_resume_is_exact(tmp_path: Path) -> None:
    """SIGTERM to the launcher only (as a scheduler sends it), after a held-out round: every
    rank finishes its step and exits 0, the console has one line naming the step and its
    checkpoint, and nothing is left in /dev/shm. A resume past planted torn checkpoints
    starts from the complete one, carries the run's held-out figure, tells its own steps
    from the run's, has its target log the run's step, and trains each target's stream on
    from where it stopped, no batch skipped or trained twice."""
    name = f"term{os.getpid()}"
    run_dir = tmp_path / "run"
    overrides = ["run.max_steps=10", "run.eval_every=2", "run.log_every=1"]
    overrides += ["run.checkpoint_every=0", f"run.name={name}"]
    proc, output = start_launch(run_dir, 2, 1, overrides)
    try:
        wait_for_step(proc, run_dir, 3, output.read_text)
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not eval_records(run_dir):
            assert time.monotonic() < deadline and proc.poll() is None, output.read_text()
            time.sleep(POLL_S)
        os.kill(proc.pid, signal.SIGTERM)  # the launcher only, as a scheduler would
    finally:
        text = finish_launch(proc, output)
    assert proc.returncode == 0, text[-4000:]
    _assert_quiet(text)
    for rank, role in [(0, "target"), (1, "target"), (2, "drafter")]:
        log = rank_log(run_dir, rank, role)
        assert "exiting with code 0" in log, f"rank {rank} did not exit cleanly:\n{log[-2000:]}"
    assert "stopping before step" in rank_log(run_dir, 2, "drafter")
    stopped = step_records(run_dir)[-1]["step"]
    assert 3 <= stopped < 10 and len(step_records(run_dir)) == stopped, text[-4000:]
    root = run_dir / "checkpoints"
    checkpoint = root / f"step_{stopped:08d}"
    assert (
        latest_checkpoint(root) == checkpoint and load_checkpoint(checkpoint, "cpu").step == stopped
    )
    [line] = _launcher_lines(text)
    assert line.startswith(f"ringtrain: stopped at step {stopped} (SIGTERM), "
                           f"checkpoint {checkpoint}: "
                           "resume with ringtrain-launch "), line  # fmt: skip
    assert line.endswith(" --resume"), line
    assert shm_entries(name) == []
    evaluated = eval_records(run_dir)[-1]

    plant_torn_checkpoints(root, checkpoint)
    assert latest_checkpoint(root) == checkpoint
    resumed, resumed_output = start_launch(run_dir, 2, 1, overrides, resume=True)
    text = finish_launch(resumed, resumed_output)
    assert resumed.returncode == 0, text[-4000:]
    _assert_quiet(text)
    assert f"resumed from {checkpoint} at step {stopped}" in rank_log(run_dir, 2, "drafter")
    progress = [line for line in text.splitlines() if re.search(r"\] step \d+/10 \|", line)]
    # The first line carries the run's held-out figure: the first session's last round, or
    # one that session owed (due at a step it trained, not yet reported when it stopped),
    # which the resume scores first with that step's weights.
    shown = re.search(r"tau_sim (\d+\.\d{3}) \(step (\d+)\)", progress[0])
    assert shown and evaluated["step"] <= int(shown[2]) <= stopped, text
    [record] = [r for r in eval_records(run_dir) if r["step"] == int(shown[2])]
    assert shown[1] == f"{record['tau_sim']:.3f}", text
    done = f"done: this session {10 - stopped} steps ({stopped + 1} to 10), "
    assert done in text and "; run: 10 steps |" in text, text[-4000:]
    session = rank_log(run_dir, 0, "target").split("exiting with code")[1]
    steps = [int(s) for s in re.findall(r"INFO step (\d+) \| \d+ batches produced", session)]
    assert steps and min(steps) > stopped, session  # the run's step, not this session's count
    records = step_records(run_dir)
    assert [r["step"] for r in records] == list(range(1, 11))
    _assert_each_stream_trained_in_order(run_dir, trained_batches(records))
    assert shm_entries(name) == []


@pytest.mark.slow
def test_a_rank_killed_for_real_is_named_with_its_log_in_the_last_line(tmp_path: Path) -> None:
    """SIGKILL of one drafter mid-run: the launcher's last line names that rank (not a peer
    that noticed), how it ended and its log; the exit code is not 0 and nothing is left in
    /dev/shm."""
    name = f"killed{os.getpid()}"
    run_dir = tmp_path / "run"
    overrides = ["run.max_steps=1000", "run.log_every=1", "run.eval_every=0"]
    overrides += ["run.checkpoint_every=0", f'run.name="{name}"']
    proc, output = start_launch(run_dir, 1, 2, overrides)
    try:
        wait_for_step(proc, run_dir, 2, output.read_text)
        victim = rank_row(name, 2)
        os.kill(victim.pid, signal.SIGKILL)
    finally:
        text = finish_launch(proc, output)
    assert proc.returncode != 0, text[-4000:]
    _assert_quiet(text)
    last = _launcher_lines(text)[-1]
    assert f"rank 2 (drafter, pid {victim.pid})" in last, text[-4000:]
    assert "SIGKILL" in last, last
    assert last.endswith(f"(its log: {run_dir / 'logs' / 'rank2-drafter.log'})"), last
    assert shm_entries(name) == []


def _assert_each_stream_trained_in_order(
    run_dir: Path, batches: list[tuple[int, int, int]]
) -> None:
    """One drafter takes each target's slots in publication order, so each of the two
    targets' trained sequence numbers must be a gapless prefix of its stream (nothing
    skipped, nothing twice) and their batch ids the stream's."""
    assert len(set((p, s) for p, s, _ in batches)) == len(batches), "a batch trained twice"
    seqs = {p: sorted(s for q, s, _ in batches if q == p) for p in (0, 1)}
    for target, got in seqs.items():
        assert got == list(range(len(got))), f"target {target} trained seqs {got}"
    expected = expected_batch_ids(run_dir, 2, {p: len(s) for p, s in seqs.items()})
    for target in (0, 1):
        got_ids = [b for q, s, b in sorted(batches) if q == target]
        assert got_ids == expected[target], f"target {target} trained other batches"


def _outcome(rank: int, kind: str, code: int = 0, wall: float = 0.0, **fields) -> Outcome:
    return Outcome(rank=rank, code=code, kind=kind, wall=wall, **fields)


def test_the_report_names_a_ranks_own_failure_before_the_peers_that_saw_it() -> None:
    outcomes = [
        _outcome(0, PEER_FAILED, 1, wall=1.0, message="rank 1 (drafter) failed"),
        _outcome(1, FAILED, 1, wall=2.0, message="rank1-drafter0 failed: boom", log="r1.log"),
    ]
    assert describe_end(outcomes, 2, {0: 1, 1: 1}, "", "x") == (
        1,
        "rank1-drafter0 failed: boom (its log: r1.log)",
    )
    # A rank killed outright reports nothing: it is the cause, the others only saw it.
    assert describe_end(outcomes[:1], 2, {0: 1, 1: -9}, "", "x") == (
        137,
        "rank 1 was killed by SIGKILL without reporting an error",
    )
    refused = [_outcome(r, REFUSED, 2, wall=r, message="bad value") for r in (1, 0)]
    assert describe_end(refused, 2, {0: 2, 1: 2}, "", "x") == (2, "bad value")


def test_the_report_of_a_stop_names_what_happened_to_every_rank() -> None:
    lead = _outcome(1, STOPPED, signal="SIGTERM", step=7, checkpoint="/c/step_7")
    target = _outcome(0, STOPPED, signal="SIGTERM")
    assert describe_end([target, lead], 2, {}, "SIGTERM", "cmd --resume") == (
        0,
        "stopped at step 7 (SIGTERM), checkpoint /c/step_7: resume with cmd --resume",
    )
    assert describe_end([lead], 2, {}, "SIGTERM", "cmd")[0] == 128 + signal.SIGTERM
    assert describe_end([_outcome(0, "done"), _outcome(1, "done")], 2, {}, "", "cmd") == (0, "")


def test_of_several_failures_the_report_names_the_earliest() -> None:
    own = [
        _outcome(0, FAILED, 1, wall=5.0, message="rank0-target0 failed: later"),
        _outcome(1, FAILED, 1, wall=1.0, message="rank1-drafter0 failed: first"),
    ]
    assert describe_end(own, 2, {0: 1, 1: 1}, "", "x") == (1, "rank1-drafter0 failed: first")
    seen = [
        _outcome(0, PEER_FAILED, 1, wall=4.0, message="rank 2 is hung", culprit=2, primary=True),
        _outcome(1, PEER_FAILED, 1, wall=2.0, message="rank 3 died", culprit=3, primary=True),
    ]
    assert describe_end(seen, 4, {0: 1, 1: 1}, "", "x") == (1, "rank 3 died")
    # Echoes only, each blaming a rank that left no report: the earliest echo is named.
    echoes = [
        _outcome(0, PEER_FAILED, 1, wall=1.0, message="rank 3 aborted the ring", culprit=3),
        _outcome(2, PEER_FAILED, 1, wall=3.0, message="rank 1 aborted the ring", culprit=1),
    ]
    assert describe_end(echoes, 4, {}, "", "x") == (1, "rank 3 aborted the ring")


def test_a_stop_where_one_rank_was_still_starting_says_nothing_was_trained() -> None:
    starting = _outcome(0, STOPPED, 130, signal="SIGINT")
    lead = _outcome(1, STOPPED, signal="SIGINT")
    assert describe_end([starting, lead], 2, {}, "SIGINT", "cmd") == (
        130,
        "stopped by SIGINT during start-up: nothing trained yet, no checkpoint written",
    )


def test_the_command_line_splits_at_the_first_option_of_ringtrain_main() -> None:
    assert split_arguments(["--nproc-per-node", "2", "--config=x.toml", "--resume"]) == (
        ["--nproc-per-node", "2"],
        ["--config=x.toml", "--resume"],
    )
    assert split_arguments(["--standalone", "--", "--config", "x.toml"]) == (
        ["--standalone"],
        ["--config", "x.toml"],
    )
    assert split_arguments(["--standalone"]) == (["--standalone"], [])


def test_the_resume_command_drops_overwrite_and_adds_resume_once() -> None:
    fresh = ["--standalone", "--config", "x.toml", "--overwrite"]
    assert resume_command(fresh) == "ringtrain-launch --standalone --config x.toml --resume"
    resumed = ["--standalone", "--config", "my run.toml", "--resume"]
    assert (
        resume_command(resumed) == "ringtrain-launch --standalone --config 'my run.toml' --resume"
    )


def test_a_script_or_a_bad_option_is_refused_once_by_the_launcher(
    capsys: pytest.CaptureFixture,
) -> None:
    with pytest.raises(SystemExit) as refusal:
        torchrun_arguments(["--standalone", "train.py", "--lr", "1"])
    assert str(refusal.value).startswith(
        "ringtrain-launch: 'train.py --lr 1' is not an option of torchrun or of ringtrain.main"
    )
    with pytest.raises(SystemExit) as refusal:
        torchrun_arguments(["--standalone", "--config", "x.toml", "--no-such-option"])
    assert refusal.value.code == 2
    assert "unrecognized arguments: --no-such-option" in capsys.readouterr().err
    args = torchrun_arguments(["--standalone", "--nproc-per-node", "3", "--config", "x.toml"])
    assert (args.nproc_per_node, args.training_script_args) == ("3", ["--config", "x.toml"])
