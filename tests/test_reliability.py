"""Failure semantics of whole runs: killed ranks, torn checkpoints, and hostile input that must be
refused before any model is loaded.

Runs use real torchrun processes on CPU with the embedded tiny config. Every wait polls
files or processes against a deadline.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc
import pytest
import torch

from ringtrain.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from ringtrain.checkpoint.layout import CheckpointError
from ringtrain.checkpoint.resume_record import ResumeRecord
from ringtrain.data import write_synthetic_dataset
from ringtrain.data.writer import TokenFileWriter
from ringtrain.drafter import DFlashDrafter, build_optimizer, drafter_spec_from_target
from ringtrain.drafter.config import DrafterConfig
from ringtrain.monitor.stat_view import format_snapshot
from ringtrain.target import build_tiny_target, read_target_config
from ringtrain.target.taps import default_tap_layers
from tests.helpers.checkpoints import plant_torn_checkpoints
from tests.helpers.launcher import (
    launch,
    pid_alive,
    rank_log,
    ring_reader,
    run_env,
    shm_entries,
    stop_all,
    tiny_config,
    wait_for_step,
    wait_gone,
)
from tests.helpers.tiny_drafter import PAPER_DRAFTER, paper_optim

# Every surviving rank must be gone this long after a peer was killed.
EXIT_AFTER_KILL_S = 30.0
# A run refused for bad input exits well within this (it never starts distributed work).
VALIDATION_TIMEOUT_S = 240.0


# ---- SIGKILL of one rank -------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize(
    ("targets", "drafters", "victim_rank"),
    [
        pytest.param(2, 1, 0, id="target-killed"),
        pytest.param(1, 2, 2, id="drafter-killed"),
    ],
)
def test_killed_rank_stops_every_other_rank(
    tmp_path: Path, targets: int, drafters: int, victim_rank: int
) -> None:
    name = f"kill{victim_rank}{os.getpid()}"
    run_dir = tmp_path / "run"
    launched = launch(
        run_dir,
        targets,
        drafters,
        [
            "run.max_steps=500",
            "run.log_every=1",
            "run.checkpoint_every=1",
            "run.eval_every=0",
            f"run.name={name}",
            "ring.heartbeat_timeout_s=20",
        ],
    )
    try:
        # Step 2 has begun only after the step-1 checkpoint was written.
        wait_for_step(launched.proc, launched.run_dir, 2, launched.text)
        reader = ring_reader(name)
        try:
            ranks = {r.rank: r for r in reader.snapshot().ranks}
            assert sorted(ranks) == list(range(targets + drafters))
            victim = ranks[victim_rank]
            survivors = [r for r in ranks.values() if r.rank != victim_rank]
            os.kill(victim.pid, signal.SIGKILL)
            took = wait_gone([r.pid for r in survivors], EXIT_AFTER_KILL_S)
            launched.proc.wait(EXIT_AFTER_KILL_S)
            snapshot = reader.snapshot()
        finally:
            reader.close()
    finally:
        stop_all(launched)
    output = launched.text()
    assert launched.proc.returncode != 0, output[-3000:]
    named = f"rank {victim_rank} ({victim.label}, pid {victim.pid})"
    assert named in output, f"the terminal does not name {named} ({took:.1f} s):\n{output[-3000:]}"
    for survivor in survivors:
        log = rank_log(run_dir, survivor.rank, survivor.label)
        assert named in log, f"rank {survivor.rank}'s log does not name {named}:\n{log[-2000:]}"
        # It failed (exit 1) or its watchdog stopped it (exit 1); it never exited cleanly.
        assert "failed:" in log or "stopping this rank" in log, log[-2000:]
        assert "exiting with code 0" not in log
    # ringtrain-stat's reading of the ring shows the killed rank as dead, not slow.
    dead = next(r for r in snapshot.ranks if r.rank == victim_rank)
    assert not dead.alive and f"process {victim.pid} is gone" in dead.dead_reason
    assert "DEAD (died" in format_snapshot(snapshot)
    assert shm_entries(name) == []
    checkpoint = latest_checkpoint(run_dir / "checkpoints")
    assert checkpoint is not None
    loaded = load_checkpoint(checkpoint, "cpu")
    assert loaded.step >= 1 and loaded.model is not None


def test_a_killed_launcher_stops_every_rank(tmp_path: Path) -> None:
    """SIGKILL to torchrun's agent alone reaches none of its ranks (each runs in a session
    of its own): their watchdogs see the launcher gone and stop them, saying why."""
    name = f"orphan{os.getpid()}"
    run_dir = tmp_path / "run"
    launched = launch(
        run_dir, 1, 2, ["run.max_steps=500", "run.log_every=1", "run.eval_every=0",
                        f"run.name={name}"],
    )  # fmt: skip
    ranks = []
    try:
        wait_for_step(launched.proc, launched.run_dir, 2, launched.text)
        reader = ring_reader(name)
        try:
            ranks = reader.snapshot().ranks
        finally:
            reader.close()
        launched.proc.kill()
        launched.proc.wait(EXIT_AFTER_KILL_S)
        wait_gone([r.pid for r in ranks], EXIT_AFTER_KILL_S)
    finally:
        stop_all(launched)
        for rank in ranks:  # nothing outlives the test, even when the check fails
            if pid_alive(rank.pid):
                os.kill(rank.pid, signal.SIGKILL)
    for rank in ranks:
        log = rank_log(run_dir, rank.rank, rank.label)
        assert "the launcher of this rank" in log and "is gone" in log, log[-2000:]
        assert "exiting with code 0" not in log
    assert shm_entries(name) == []


# ---- a crash while a checkpoint is written ------------------------------------------------------


def test_crash_mid_checkpoint_never_leaves_a_complete_looking_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = build_tiny_target(tmp_path / "target", num_layers=4)
    config = read_target_config(target)
    spec = drafter_spec_from_target(
        config, DrafterConfig(**PAPER_DRAFTER, num_layers=1, block_size=4), [1, 2]
    )
    model = DFlashDrafter(spec)
    optimizer, scheduler = build_optimizer(model, paper_optim(), 10)
    root = tmp_path / "checkpoints"
    good = save_checkpoint(root, 1, model, spec, optimizer, scheduler, ResumeRecord(step=1))

    def crash(*_args: object, **_kwargs: object) -> None:
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(CheckpointError, match="simulated"):
        save_checkpoint(root, 2, model, spec, optimizer, scheduler, ResumeRecord(step=2))
    monkeypatch.undo()
    assert not (root / "step_00000002").exists()
    assert not [p.name for p in root.iterdir() if p.name.startswith(".tmp-")], "torn copy kept"
    assert latest_checkpoint(root) == good
    plant_torn_checkpoints(root, good)
    assert latest_checkpoint(root) == good
    assert load_checkpoint(root, "cpu").path == good


# ---- hostile input ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Inputs:
    """A tiny target and datasets, shared by the hostile-input cases."""

    target: Path
    data: Path
    vocab_size: int


def _write_rows(path: Path, rows: list[int], mask_value: int = 1) -> Path:
    """An Arrow dataset of rows of the given lengths (every token supervised)."""
    path.mkdir(parents=True)
    offsets = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)
    ids = (np.arange(offsets[-1]) % 100 + 1).astype(np.int32)
    with TokenFileWriter(path / "part-0.arrow") as writer:
        writer.write(offsets, ids, np.full(offsets[-1], mask_value, dtype=np.uint8))
    return path


def _case_setup(root: Path, inputs: Inputs, case: str) -> list[str]:
    """Build what hostile case `case` needs under `root`; returns its extra arguments."""
    if case == "unknown-key":
        return ["--set", "run.max_stepz=3"]
    if case == "tap-out-of-range":
        return ["--set", "target.tap_layers=[1, 99]"]
    if case == "drafter-override-conflicts":
        return ["--set", f"drafter.mask_token_id={inputs.vocab_size}"]
    if case == "drafter-hidden-size-key":
        return ["--set", "drafter.hidden_size=128"]
    if case == "resume-other-target":
        other = build_tiny_target(root / "other-target", hidden_size=32, vocab_size=640)
        cfg = tiny_config([])
        taps = default_tap_layers(8, cfg.target.num_taps)
        spec = drafter_spec_from_target(read_target_config(other), cfg.drafter, taps)
        model = DFlashDrafter(spec)
        optimizer, scheduler = build_optimizer(model, cfg.optim, 10)
        save_checkpoint(
            root / "run" / "checkpoints", 4, model, spec, optimizer, scheduler, ResumeRecord(step=4)
        )
        return ["--resume"]
    if case == "row-over-budget":
        data = _write_rows(root / "long-data", [200, 700, 300])
        return [
            "--set",
            f"data.path={json.dumps(str(data))}",
            "--set",
            "data.truncate=false",
            "--set",
            "data.max_len=512",
            "--set",
            "data.token_budget=512",
        ]
    if case == "no-loss-mask":
        data = root / "no-mask"
        data.mkdir()
        table = pa.table({"input_ids": pa.array([[1, 2, 3]] * 4, type=pa.list_(pa.int32()))})
        with pa.ipc.new_file(str(data / "part-0.arrow"), table.schema) as writer:
            writer.write_table(table)
        return ["--set", f"data.path={json.dumps(str(data))}"]
    if case == "shm-too-small":
        # 1024 slots of a million tokens each: far more than any /dev/shm holds.
        return ["--set", "ring.slots_per_producer=1024", "--set", "data.token_budget=1000000"]
    if case == "target-without-weights":
        bare = root / "bare-target"
        bare.mkdir()
        shutil.copy(inputs.target / "config.json", bare / "config.json")
        return ["--set", f"target.path={json.dumps(str(bare))}"]
    raise AssertionError(case)


# case -> fragments the error must contain (the problem, where, and the fix).
HOSTILE_CASES: dict[str, list[str]] = {
    "unknown-key": ["unknown field `max_stepz`", "$.run", "fix or remove that key"],
    "tap-out-of-range": ["tapped layer 99 is out of range", "valid indices are 0..7"],
    "drafter-override-conflicts": ["mask_token_id=512", "outside the vocabulary", "-1"],
    "drafter-hidden-size-key": ["unknown field `hidden_size`", "$.drafter"],
    "resume-other-target": [
        "--resume",
        "hidden_size 32 in the checkpoint vs 64 now",
        "vocab_size 640 in the checkpoint vs 512 now",
        "resume with the original config and target",
    ],
    "row-over-budget": ["row 1 has 700 tokens", "max_len = 512", "data.truncate = true"],
    "no-loss-mask": ["missing column 'loss_mask'", "ringtrain-data prepare"],
    "shm-too-small": ["/dev/shm", "--shm-size", "ring.slots_per_producer"],
    "target-without-weights": ["no weights (*.safetensors) found", "bare-target"],
}


@dataclass
class Refusal:
    """How one single-rank run with hostile input ended."""

    returncode: int
    stderr: str
    log: str


def _start_hostile_case(
    root: Path, inputs: Inputs, case: str
) -> tuple[subprocess.Popen[str], Path]:
    """Start rank 0 of a 3-rank run of one hostile case; returns it and its run directory."""
    env = run_env() | {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "3",
        "LOCAL_WORLD_SIZE": "3",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29431",
    }
    run_dir = root / "run"
    extra = _case_setup(root, inputs, case)
    command = [
        sys.executable, "-m", "ringtrain.main",
        "--set", f"run.run_dir={json.dumps(str(run_dir))}",
        "--set", 'run.device="cpu"',
        "--set", f"target.path={json.dumps(str(inputs.target))}",
        "--set", f"data.path={json.dumps(str(inputs.data))}",
        "--set", "run.eval_every=0",
        *extra,
    ]  # fmt: skip
    proc = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    return proc, run_dir


@pytest.fixture(scope="module")
def refusals(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Refusal]]:
    """Start every hostile case at once (rank 0 of a 3-rank run, no torchrun) and collect them.

    Validation runs before any collective, so a refused run exits on its own; one that
    passed validation would block in distributed start-up and time out instead.
    """
    shared = tmp_path_factory.mktemp("inputs")
    target = build_tiny_target(shared / "target")
    vocab = read_target_config(target).vocab_size
    data = write_synthetic_dataset(
        shared / "data", rows=300, vocab_size=vocab, mean_len=120, seed=0
    )
    inputs = Inputs(target, data, vocab)
    started = {
        case: _start_hostile_case(tmp_path_factory.mktemp(case), inputs, case)
        for case in HOSTILE_CASES
    }
    results = {}
    try:
        for case, (proc, run_dir) in started.items():
            try:
                _, stderr = proc.communicate(timeout=VALIDATION_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, stderr = proc.communicate()
                stderr += "\n<timed out: validation passed and the rank waited for its peers>"
            log_file = run_dir / "logs" / "rank0-target.log"
            log = log_file.read_text() if log_file.exists() else ""
            results[case] = Refusal(proc.returncode, stderr, log)
        yield results
    finally:
        for proc, _ in started.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.mark.parametrize("case", list(HOSTILE_CASES))
def test_hostile_input_is_refused_before_any_model_loads(
    refusals: dict[str, Refusal], case: str
) -> None:
    refusal = refusals[case]
    assert refusal.returncode == 2, refusal.stderr[-3000:]
    message = refusal.stderr.strip()
    assert message.startswith("ringtrain: "), message
    assert "Traceback" not in message
    for fragment in HOSTILE_CASES[case]:
        assert fragment in message, f"{fragment!r} missing from: {message}"
    assert "loading target" not in refusal.log
    assert "ready: transport" not in refusal.log, "the ring was set up"
