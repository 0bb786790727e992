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
import subprocess
import time
from pathlib import Path

import pytest

from ringtrain.trainer.outcome import FAILED, PEER_FAILED, REFUSED, STOPPED, Outcome
from ringtrain.trainer.report import describe_end
from tests.launcher import (
    RUN_TIMEOUT_S,
    eval_records,
    launch_command,
    run_env,
    step_records,
    wait_for_step,
)

POLL_S = 0.1
TORCH_NOISE = ("Traceback", "SignalException", "ChildFailedError", "Logging error")
TORCH_LOG_LINE = re.compile(r"^[IWE]\d{4} ", re.MULTILINE)  # torch's launcher's log format


def _launch(run_dir: Path, targets: int, drafters: int, overrides: list[str], **kwargs):
    output = run_dir.with_name(run_dir.name + ".out")
    with output.open("wb") as sink:
        proc = subprocess.Popen(
            launch_command(run_dir, targets, drafters, overrides, **kwargs),
            env=run_env(),
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return proc, output


def _finish(proc: subprocess.Popen, output: Path) -> str:
    try:
        proc.wait(RUN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return output.read_text(errors="replace")


def _assert_quiet(text: str) -> None:
    for noise in TORCH_NOISE:
        assert noise not in text, f"{noise!r} on the console:\n{text[-4000:]}"
    assert not TORCH_LOG_LINE.search(text), f"torch's launcher logged:\n{text[-4000:]}"


def _launcher_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("ringtrain: ")]


def test_a_refusal_alike_on_every_rank_is_said_once_with_exit_code_2(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc, output = _launch(run_dir, 1, 2, ['target.path="/nonexistent/target"'])
    text = _finish(proc, output)
    assert proc.returncode == 2, text[-4000:]
    _assert_quiet(text)
    lines = _launcher_lines(text)
    assert len(lines) == 1 and "/nonexistent/target" in lines[0], text[-4000:]
    assert text.count("/nonexistent/target") == 1, text[-4000:]


def test_ctrl_c_during_start_up_ends_with_one_line_and_130(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc, output = _launch(run_dir, 1, 2, ["run.max_steps=1000"])
    deadline = time.monotonic() + RUN_TIMEOUT_S
    logs = run_dir / "logs"
    while not (logs.is_dir() and len(list(logs.glob("rank*.log"))) == 3):
        assert proc.poll() is None, output.read_text()[-4000:]
        assert time.monotonic() < deadline, "the ranks never opened their logs"
        time.sleep(POLL_S)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
    text = _finish(proc, output)
    assert proc.returncode == 128 + signal.SIGINT, text[-4000:]
    _assert_quiet(text)
    assert _launcher_lines(text) == [
        "ringtrain: stopped by SIGINT during start-up: nothing trained yet, no checkpoint written"
    ], text[-4000:]
    assert "leaving now" not in text  # each rank's own notice stays in its log


@pytest.mark.slow
def test_sigterm_stops_cleanly_and_the_resumed_session_reports_the_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    overrides = ["run.max_steps=8", "run.eval_every=2", "run.log_every=1", "run.checkpoint_every=0"]
    proc, output = _launch(run_dir, 1, 1, overrides)
    try:
        wait_for_step(proc, run_dir, 3, output.read_text)
        deadline = time.monotonic() + RUN_TIMEOUT_S
        while not eval_records(run_dir):
            assert time.monotonic() < deadline and proc.poll() is None, output.read_text()
            time.sleep(POLL_S)
        os.kill(proc.pid, signal.SIGTERM)  # the launcher only, as a scheduler would
    finally:
        text = _finish(proc, output)
    assert proc.returncode == 0, text[-4000:]
    _assert_quiet(text)
    stopped = step_records(run_dir)[-1]["step"]
    checkpoint = run_dir / "checkpoints" / f"step_{stopped:08d}"
    [line] = _launcher_lines(text)
    assert line.startswith(f"ringtrain: stopped at step {stopped} (SIGTERM), checkpoint {checkpoint}: "
                           "resume with ringtrain-launch "), line  # fmt: skip
    assert line.endswith(" --resume"), line
    evaluated = eval_records(run_dir)[-1]

    resumed, resumed_output = _launch(run_dir, 1, 1, overrides, resume=True)
    text = _finish(resumed, resumed_output)
    assert resumed.returncode == 0, text[-4000:]
    _assert_quiet(text)
    progress = [line for line in text.splitlines() if re.search(r"\] step \d+/8 \|", line)]
    assert f"tau_sim {evaluated['tau_sim']:.3f} (step {evaluated['step']})" in progress[0], text
    done = f"done: this session {8 - stopped} steps ({stopped + 1} to 8), "
    assert done in text and "; run: 8 steps |" in text, text[-4000:]
    session = (run_dir / "logs" / "rank0-target.log").read_text().split("exiting with code")[1]
    steps = [int(s) for s in re.findall(r"INFO step (\d+) \| \d+ batches produced", session)]
    assert steps and min(steps) > stopped, session  # the run's step, not this session's count


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
