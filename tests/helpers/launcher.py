"""Helpers for tests that start real training runs through torchrun."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import pytest

from ringtrain.config import Config, parse_config
from ringtrain.cpu_math import settle_cpu_math
from ringtrain.data import BatchStream, open_dataset
from ringtrain.ring import RingReader, discover
from ringtrain.trainer.groups import close_groups
from tests.helpers.gloo_pair import spawn_pair

RUN_TIMEOUT_S = 300
POLL_S = 0.1


def as_torchrun_rank(
    monkeypatch: pytest.MonkeyPatch,
    rank: int = 0,
    local_rank: int = 0,
    world_size: int = 3,
    local_world_size: int = 3,
) -> None:
    """Make this process look like one rank that torchrun started (its environment
    variables), for code that reads them in the test process."""
    for name, value in {
        "RANK": rank,
        "LOCAL_RANK": local_rank,
        "WORLD_SIZE": world_size,
        "LOCAL_WORLD_SIZE": local_world_size,
    }.items():
        monkeypatch.setenv(name, str(value))


def torchrun_command(
    run_dir: Path,
    targets: int,
    drafters: int,
    overrides: list[str],
    resume: bool = False,
    flags: Sequence[str] = (),
) -> list[str]:
    """The command line of a tiny CPU run with the given layout and config overrides."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={targets + drafters}",
        "-m",
        "ringtrain.main",
        "--set",
        f"run.run_dir={json.dumps(str(run_dir))}",
        "--set",
        f"layout.targets_per_node={targets}",
        "--set",
        f"layout.drafters_per_node={drafters}",
        "--set",
        'run.device="cpu"',
    ]
    for item in overrides:
        command += ["--set", item]
    if resume:
        command.append("--resume")
    return command + list(flags)


def run_env() -> dict[str, str]:
    """Environment for child runs: one thread per process on the small CI machine."""
    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def run_training(
    run_dir: Path,
    targets: int,
    drafters: int,
    overrides: list[str],
    resume: bool = False,
    flags: Sequence[str] = (),
) -> subprocess.CompletedProcess[str]:
    """Run a training job to completion and return its finished process."""
    return subprocess.run(
        torchrun_command(run_dir, targets, drafters, overrides, resume, flags),
        env=run_env(),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )


def start_training(
    run_dir: Path, targets: int, drafters: int, overrides: list[str], resume: bool = False
) -> subprocess.Popen[str]:
    """Start a training job in a process group of its own (so a test can signal the whole
    launch) with its output merged on one pipe; returns the running launcher."""
    return subprocess.Popen(
        torchrun_command(run_dir, targets, drafters, overrides, resume),
        env=run_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def metric_records(run_dir: Path, event: str) -> list[dict]:
    """The records of one event type ("step", "eval") in metrics.jsonl, in file order."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in records if r.get("event") == event]


def step_records(run_dir: Path) -> list[dict]:
    """The per-step records of metrics.jsonl, in file order."""
    return metric_records(run_dir, "step")


def wait_for_step(
    proc: subprocess.Popen, run_dir: Path, step: int, output: Callable[[], str] = str
) -> None:
    """Poll metrics.jsonl until the run's last step record reaches `step`; fail, with the
    end of the run's output, when the run ends first or RUN_TIMEOUT_S passes."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while not (records := step_records(run_dir)) or records[-1]["step"] < step:
        assert proc.poll() is None, f"the run ended before step {step}:\n{output()[-3000:]}"
        assert time.monotonic() < deadline, f"step {step} never came:\n{output()[-3000:]}"
        time.sleep(POLL_S)


def eval_records(run_dir: Path) -> list[dict]:
    """The held-out evaluation records of metrics.jsonl, in file order."""
    return metric_records(run_dir, "eval")


def trained_batches(records: list[dict]) -> list[tuple[int, int, int]]:
    """(producer, seq, batch_id) of every batch trained, step by step."""
    return [tuple(b) for r in records for b in r["batches"]]


def shm_entries(marker: str) -> list[str]:
    """Names in /dev/shm that contain `marker`."""
    return sorted(name for name in os.listdir("/dev/shm") if marker in name)


def worker_pid(launcher_pid: int, local_rank: int) -> int:
    """The pid of the worker of local rank `local_rank` that torchrun `launcher_pid` started."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            environ = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if parent == launcher_pid and f"LOCAL_RANK={local_rank}".encode() in environ:
            return int(entry.name)
    raise LookupError(f"torchrun {launcher_pid} has no worker of local rank {local_rank}")


def gloo_member(worker: Callable[[int, str, str], None], rank: int, store: str, out: str) -> None:
    """One process of `run_gloo_pair`: the worker, then its groups closed as a rank of a
    run closes them (after the worker's frame, and the modules it held, are gone); the
    CPU's vector math settled first, as a rank's start settles it."""
    settle_cpu_math()
    worker(rank, store, out)
    close_groups()


def run_gloo_pair(worker: Callable[[int, str, str], None], tmp_path: Path) -> list[dict]:
    """Run ``worker(rank, store, out)`` in two spawned processes (a gloo group over a file
    store under ``tmp_path``, which the worker joins) and return what each saved as
    ``<out>/<rank>.pt`` (`gloo_pair.spawn_pair`)."""
    return spawn_pair(gloo_member, worker, tmp_path, timeout_s=120.0)


def launch_command(
    run_dir: Path,
    targets: int,
    drafters: int,
    overrides: list[str],
    resume: bool = False,
    launcher_flags: Sequence[str] = (),
) -> list[str]:
    """The run of `torchrun_command` started through ringtrain-launch (python -m
    ringtrain.launch: torchrun's options, `launcher_flags` among them, then
    ringtrain.main's)."""
    command = torchrun_command(run_dir, targets, drafters, overrides, resume)
    module = command.index("ringtrain.main")
    return [
        sys.executable,
        "-m",
        "ringtrain.launch",
        *command[3 : module - 1],
        *launcher_flags,
        *command[module + 1 :],
    ]


def start_launch(
    run_dir: Path,
    targets: int,
    drafters: int,
    overrides: list[str],
    env: dict[str, str] | None = None,
    output: Path | None = None,
    **kwargs,
) -> tuple[subprocess.Popen, Path]:
    """`launch_command`'s run started in a process group of its own (`env`: run_env()'s by
    default), its console in `output` (default: beside run_dir, named <run_dir>.out)."""
    output = output or run_dir.with_name(run_dir.name + ".out")
    with output.open("wb") as sink:
        proc = subprocess.Popen(
            launch_command(run_dir, targets, drafters, overrides, **kwargs),
            env=env or run_env(),
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return proc, output


def finish_launch(proc: subprocess.Popen, output: Path, timeout_s: float = RUN_TIMEOUT_S) -> str:
    """Wait for a `start_launch` run to end (its process group killed after `timeout_s`);
    its console."""
    try:
        proc.wait(timeout_s)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return output.read_text(errors="replace")


def tiny_config(overrides: list[str]) -> Config:
    """The embedded default config (ringtrain/tiny.toml) with `overrides` applied."""
    text = resources.files("ringtrain").joinpath("tiny.toml").read_text(encoding="utf-8")
    return parse_config(text, "<tiny.toml>", overrides)


def expected_batch_ids(run_dir: Path, targets: int, upto: dict[int, int]) -> dict[int, list[int]]:
    """The batch ids each target's deterministic stream of the embedded default run in
    `run_dir` yields for seq 0..upto[target]-1."""
    config = tiny_config([])
    data = config.data
    dataset = open_dataset(
        run_dir / "builtin" / "data",
        max_len=data.max_len,
        truncate=data.truncate,
        block_size=config.drafter.block_size,
    )
    expected = {}
    for target, count in upto.items():
        stream = BatchStream(
            dataset,
            token_budget=data.token_budget,
            bucket=data.bucket,
            seed=data.seed,
            rank=target,
            world=targets,
        )
        expected[target] = [next(stream).batch_id for _ in range(count)]
    return expected


@dataclass
class Launched:
    """A torchrun launch in the background, its output going to a file."""

    proc: subprocess.Popen[bytes]
    run_dir: Path
    output: Path

    def text(self) -> str:
        return self.output.read_text(errors="replace")


def launch(run_dir: Path, targets: int, drafters: int, overrides: list[str]) -> Launched:
    """Start a run of `torchrun_command` in a session of its own, its output in a file
    beside `run_dir`."""
    output = run_dir.with_name(run_dir.name + ".out")
    with output.open("wb") as sink:
        proc = subprocess.Popen(
            torchrun_command(run_dir, targets, drafters, overrides),
            env=run_env(),
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return Launched(proc, run_dir, output)


def stop_all(launched: Launched) -> None:
    """Make sure nothing of a launch outlives its test (the workers have their own sessions)."""
    if launched.proc.poll() is None:
        launched.proc.kill()
        launched.proc.wait(RUN_TIMEOUT_S)


def ring_reader(name: str) -> RingReader:
    """A read-only mapping of the live ring of run `name` (as ringtrain-stat makes one)."""
    rings = [r for r in discover() if r.run.startswith(f"{name}-") and r.pids]
    assert len(rings) == 1, f"expected one live ring of run {name}, found {rings}"
    return RingReader(rings[0])


def rank_row(name: str, index: int):
    """Rank `index`'s row (pid, role, ...) in the live ring of run `name`'s snapshot."""
    reader = ring_reader(name)
    try:
        return reader.snapshot().ranks[index]
    finally:
        reader.close()


def pid_alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def wait_gone(pids: list[int], timeout: float) -> float:
    """Seconds until every pid in `pids` is gone; fails after `timeout`."""
    start = time.monotonic()
    while any(pid_alive(pid) for pid in pids):
        assert time.monotonic() - start < timeout, f"pids {pids} still alive after {timeout} s"
        time.sleep(POLL_S)
    return time.monotonic() - start


def rank_log(run_dir: Path, rank: int, role: str) -> str:
    """The log file of rank `rank` (role "target" or "drafter") of the run in `run_dir`."""
    return (run_dir / "logs" / f"rank{rank}-{role}.log").read_text()
