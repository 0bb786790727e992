"""Resume that is exact or refuses, one run per run directory, and honest I/O, through
real torchrun runs of the embedded default on CPU.

One finished 4-step run (checkpoints at steps 2 and 4) is made once per module; each test
works on its own copy. Waits poll files and processes against a deadline.
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import signal
import socket
import subprocess
from pathlib import Path

import msgspec
import pytest
import torch
from safetensors.torch import load_file

from ringtrain.checkpoint.layout import WEIGHTS_FILE
from ringtrain.checkpoint.resume_record import (
    RESUME_FILE,
    encode_resume_record,
    read_resume_record,
)
from ringtrain.checkpoint.verify import latest_checkpoint
from ringtrain.drafter.schedules import WarmupCosine
from ringtrain.trainer.run_dir import read_run_id
from tests.helpers.launcher import (
    RUN_TIMEOUT_S,
    run_env,
    run_training,
    step_records,
    torchrun_command,
    wait_for_step,
    worker_pid,
)
from tests.helpers.tiny_drafter import PAPER_SETS

# The paper's recipe (AdamW, cosine): the schedule and the checkpoint sizes checked below.
BASE = [
    "run.max_steps=4", "run.checkpoint_every=2", "run.eval_every=0", "run.log_every=1",
    *PAPER_SETS,
]  # fmt: skip


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    done = run_training(run_dir, 2, 1, BASE)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return run_dir


@pytest.fixture
def run_dir(finished_run: Path, tmp_path: Path) -> Path:
    """A copy of the finished 4-step run for one test."""
    return Path(shutil.copytree(finished_run, tmp_path / "run"))


def refused_in_preflight(done: subprocess.CompletedProcess) -> bool:
    """Whether torchrun reports a worker that exited with code 2 (refused input)."""
    return done.returncode != 0 and re.search(r"exitcode\s*: 2\b", done.stderr) is not None


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"step_{step:08d}"


def drafter_log(run_dir: Path) -> str:
    return (run_dir / "logs" / "rank2-drafter.log").read_text()


def metrics_lines(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def start_background(run_dir: Path, overrides: list[str], output: Path) -> subprocess.Popen:
    with output.open("wb") as sink:
        return subprocess.Popen(
            torchrun_command(run_dir, 2, 1, BASE + overrides, resume=True),
            env=run_env(),
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(RUN_TIMEOUT_S)


# ---- a resume that is exact or refuses ---------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("override", "targets", "setting", "now", "saved"),
    [
        ("data.token_budget=1024", 2, "data.token_budget", "1024", "2048"),
        ("run.seed=0", 1, "target count (layout.targets_per_node x nodes)", "1", "2"),
    ],
)
def test_resume_refuses_a_changed_batch_sequence(
    run_dir: Path, override: str, targets: int, setting: str, now: str, saved: str
) -> None:
    before = (run_dir / "metrics.jsonl").read_bytes()
    done = run_training(run_dir, targets, 1, [*BASE, "run.max_steps=6", override], resume=True)
    assert done.returncode != 0 and refused_in_preflight(done)
    message = f"ringtrain: --resume: {setting} is {now} but checkpoint "
    assert done.stderr.count(message) == 1, done.stderr[-3000:]
    assert f"was trained with {saved}; the batch sequence would change" in done.stderr
    assert (run_dir / "metrics.jsonl").read_bytes() == before  # refused before any training


@pytest.mark.slow
def test_resume_follows_the_configured_schedule_and_optimizer_settings(run_dir: Path) -> None:
    done = run_training(run_dir, 2, 1, [*BASE, "run.max_steps=6", "optim.lr=2e-2"], resume=True)
    assert done.returncode == 0, done.stderr[-3000:]
    records = step_records(run_dir)
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    # The record's lr is the one the next step uses: after step 5 of a 6-step cosine.
    expected = 2e-2 * WarmupCosine(6, 0.04, 0.0)(5)
    assert records[4]["lr"] == pytest.approx(expected) and expected > 1e-3
    log = drafter_log(run_dir)
    assert f"resumed from {checkpoint_dir(run_dir, 4)} at step 4; schedule: step 4 of 6" in log
    assert "optim.lr 0.01 -> 0.02" in log and "run.max_steps 4 -> 6" in log
    before = load_file(str(checkpoint_dir(run_dir, 4) / WEIGHTS_FILE))
    after = load_file(str(checkpoint_dir(run_dir, 6) / WEIGHTS_FILE))
    assert all(not torch.equal(before[name], after[name]) for name in before)


# ---- one run per run directory -----------------------------------------------------------


@pytest.mark.slow
def test_a_fresh_start_over_checkpoints_needs_overwrite(run_dir: Path) -> None:
    old_run_id = read_run_id(run_dir)
    refused = run_training(run_dir, 1, 1, BASE)
    assert refused.returncode != 0 and refused_in_preflight(refused)
    assert refused.stderr.count("holds checkpoints of an earlier run (newest step_00000004)") == 1
    assert "--overwrite" in refused.stderr
    done = run_training(run_dir, 2, 1, [*BASE, "run.max_steps=2"], flags=["--overwrite"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_00000002"]
    assert [r["step"] for r in step_records(run_dir)] == [1, 2]
    run_id = read_run_id(run_dir)
    assert run_id not in (None, old_run_id)
    assert read_resume_record(checkpoint_dir(run_dir, 2)).run_id == run_id


@pytest.mark.slow
def test_overwrite_with_a_config_refused_in_preflight_deletes_nothing(run_dir: Path) -> None:
    before = {
        path.relative_to(run_dir): path.read_bytes()
        for path in sorted(run_dir.rglob("*"))
        if path.is_file() and "logs" not in path.parts and path.name != ".lock"
    }
    overrides = [*BASE, "data.max_len=4096"]  # over the token budget of 2048
    refused = run_training(run_dir, 1, 1, overrides, flags=["--overwrite"])
    assert refused_in_preflight(refused), refused.stderr[-3000:]
    assert refused.stderr.count("data.max_len = 4096 exceeds data.token_budget") == 1
    after = {
        path.relative_to(run_dir): path.read_bytes()
        for path in sorted(run_dir.rglob("*"))
        if path.is_file() and "logs" not in path.parts and path.name != ".lock"
    }
    assert after == before  # checkpoints, metrics, run id and config.json as they were


# ---- honest I/O --------------------------------------------------------------------------


def plant_other_runs_checkpoint(run_dir: Path, source_step: int, step: int) -> None:
    other = Path(
        shutil.copytree(checkpoint_dir(run_dir, source_step), checkpoint_dir(run_dir, step))
    )
    record = msgspec.structs.replace(read_resume_record(other), run_id="another-run")
    (other / RESUME_FILE).write_bytes(encode_resume_record(record))


@pytest.mark.slow
def test_after_a_crash_resume_supersedes_later_steps_and_cleans_up(run_dir: Path) -> None:
    # What a crash after step 4's record and before its checkpoint leaves, plus a torn
    # metrics line, a partial checkpoint, and another run's newer checkpoint.
    shutil.rmtree(checkpoint_dir(run_dir, 4))
    with (run_dir / "metrics.jsonl").open("a") as metrics:
        metrics.write('{"event": "step", "step": 5, "lo')
    partial = run_dir / "checkpoints" / ".tmp-step_00000003-999"
    shutil.copytree(checkpoint_dir(run_dir, 2), partial)
    plant_other_runs_checkpoint(run_dir, 2, 100)
    before = (run_dir / "metrics.jsonl").read_text()

    done = run_training(run_dir, 2, 1, BASE, resume=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"resumed from {checkpoint_dir(run_dir, 2)} at step 2" in drafter_log(run_dir)
    records = metrics_lines(run_dir)  # every line decodes: the torn one was cut
    assert [r["step"] for r in records if r["event"] == "step"] == [1, 2, 3, 4]
    assert (run_dir / "metrics.jsonl.pre-resume").read_text() == before
    assert not partial.exists() and checkpoint_dir(run_dir, 100).exists()


@pytest.mark.slow
def test_a_second_run_in_a_live_run_directory_is_refused_and_a_full_disk_is_named(
    run_dir: Path, tmp_path: Path
) -> None:
    """A second run in the directory of a live one is refused naming the holder's host and
    pid, and writes nothing; the live run trains on until a checkpoint its disk cannot
    hold ends it, naming the path, the free space and the need."""
    output = tmp_path / "live.out"
    live = start_background(run_dir, ["run.max_steps=100000", "run.checkpoint_every=20"], output)
    try:
        wait_for_step(live, run_dir, 6, output.read_text)
        holder = worker_pid(live.pid, 0)
        # Two processes are enough to be refused (the lock comes before the layout matters).
        second = run_training(run_dir, 1, 1, [*BASE, "run.max_steps=100000"], resume=True)
        assert live.poll() is None, output.read_text()[-3000:]
        # The drafter's files may now grow to 400 kB: its next optimiser state cannot.
        limit = 400 * 1024
        resource.prlimit(worker_pid(live.pid, 2), resource.RLIMIT_FSIZE, (limit, limit))
        assert live.wait(RUN_TIMEOUT_S) != 0
    finally:
        stop(live)
    assert second.returncode != 0 and refused_in_preflight(second)
    named = f"is in use by another run (host {socket.gethostname()}, pid {holder}, since "
    assert second.stderr.count(named) == 1, second.stderr[-3000:]
    # The refused run wrote nothing: one session started, each step recorded once.
    assert [r["event"] for r in metrics_lines(run_dir)].count("start") == 2
    steps = [r["step"] for r in step_records(run_dir)]
    assert steps == list(range(1, len(steps) + 1))
    # The first checkpoint due after the limit fails (step 20 unless the live run passed it
    # while the second run was refused); the one before it stays the newest.
    text = output.read_text()
    failed = re.search(r"writing checkpoint \S*/step_(\d+) failed", text)
    assert failed is not None, text[-3000:]
    step = int(failed[1])
    assert step % 20 == 0, text[-3000:]
    assert f"writing checkpoint {checkpoint_dir(run_dir, step)} failed" in text
    assert "MiB free and the checkpoint needs about" in text
    root = run_dir / "checkpoints"
    assert not [p for p in root.iterdir() if p.name.startswith(".")]
    assert latest_checkpoint(root) == checkpoint_dir(run_dir, max(step - 20, 4))
