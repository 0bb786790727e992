"""The chaos soak's rounds that are no signal to a running training run (see chaos_run.py).

corrupt  between two launches, the newest good checkpoint is damaged as users find
         them damaged (weights cut to half, weights emptied, NaN written over part of
         a tensor's data, training state cut to half, the resume record not JSON);
         the next launch resumes and is ended by a SIGTERM once every rank runs its
         loop. Checked: it exits 0, its output warns that it skipped the damaged
         checkpoint (naming it), and it resumed from the newest good one (the `start`
         record of metrics.jsonl). Exactly-once and finite weights are checked at the
         end as for every round; a damaged checkpoint no run has written again since
         is left out of the weights check (it is known to be bad).
regen    two `ringtrain-data regenerate` clients on one output against the stand-in
         chat server (ringtrain/testing/chat_server.py): the first is held at the server's
         gate after a random number of answers, the second must be refused naming the
         first's pid; the gate opens, the first is SIGKILLed at a random moment and the
         run is resumed. Checked: every input line is in the output exactly once, with
         the answer it should have (ringtrain/testing/regenerate_chats.py works that out).
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from ringtrain.checkpoint import read_resume_record
from ringtrain.checkpoint.layout import STATE_FILE, STEP_DIR, WEIGHTS_FILE
from ringtrain.checkpoint.resume_record import RESUME_FILE
from ringtrain.checkpoint.verify import checkpoint_problem
from ringtrain.data.regen_lock import lock_path
from ringtrain.testing.chat_server import ChatServer, Faults
from ringtrain.testing.regenerate_chats import MODEL, assert_all_regenerated, write_chats


@dataclass
class Round:
    """What one round did and found."""

    index: int
    fault: str
    planned_s: float  # fault time after launch, as drawn
    injected_s: float | None = None  # actual fault time after launch (None: never)
    victim_rank: int | None = None
    victim_pid: int | None = None
    stop_s: float | None = None  # fault to launcher exit
    exit_code: int | None = None
    named: bool | None = None
    detail: str | None = None  # corrupt: the damage; regen: what the first client did
    violations: list[str] = field(default_factory=list)


ROOT = Path(__file__).resolve().parents[2]
DAMAGES = ("truncate-weights", "empty-weights", "nan-weights", "truncate-state", "bad-record")
NAN_BITS = {"F32": struct.pack("<f", float("nan")), "BF16": b"\xc0\x7f", "F16": b"\x00\x7e"}
REGEN_CHATS = 300  # 375 requests
REGEN_KILL_S = 1.0  # latest SIGKILL of the first client after its gate opens
CLIENT_TIMEOUT_S = 120.0


@dataclass
class Damage:
    """A checkpoint damaged between two launches, and where a resume should land."""

    kind: str
    checkpoint: Path
    fallback: Path
    inode: int  # the damaged directory's; a checkpoint written again is a new directory
    logs: dict[Path, int]  # each rank log's size before the launch (they are appended to)

    def still_there(self) -> bool:
        """Whether the damaged checkpoint is still the one on disk (not written again)."""
        try:
            return self.checkpoint.stat().st_ino == self.inode
        except FileNotFoundError:
            return False


def good_checkpoints(checkpoints: Path) -> list[Path]:
    """The run's checkpoints that verify (checkpoint.py's checks), newest first."""
    steps = sorted(
        (int(match.group(1)), entry)
        for entry in checkpoints.glob("step_*")
        if (match := STEP_DIR.match(entry.name))
    )
    return [entry for _, entry in reversed(steps) if checkpoint_problem(entry) is None]


def write_nan(weights: Path) -> str:
    """Overwrite a random span of one float tensor's data (not the header) with NaN;
    returns the tensor's name."""
    with weights.open("r+b") as file:
        (length,) = struct.unpack("<Q", file.read(8))
        header = json.loads(file.read(length))
        floats = [k for k, v in header.items() if k != "__metadata__" and v["dtype"] in NAN_BITS]
        name = random.choice(sorted(floats))
        bits = NAN_BITS[header[name]["dtype"]]
        begin, end = header[name]["data_offsets"]
        count = (end - begin) // len(bits)
        first = random.randrange(count)
        span = random.randint(1, count - first)
        file.seek(8 + length + begin + first * len(bits))
        file.write(bits * span)
    return name


def damage_newest(checkpoints: Path) -> Damage | None:
    """Damage the newest good checkpoint in a random way (None: fewer than two good ones,
    so no fallback to check)."""
    good = good_checkpoints(checkpoints)
    if len(good) < 2:
        return None
    kind, newest = random.choice(DAMAGES), good[0]
    weights, state = newest / WEIGHTS_FILE, newest / STATE_FILE
    if kind == "truncate-weights":
        os.truncate(weights, weights.stat().st_size // 2)
    elif kind == "empty-weights":
        os.truncate(weights, 0)
    elif kind == "nan-weights":
        kind = f"{kind} ({write_nan(weights)})"
    elif kind == "truncate-state":
        os.truncate(state, state.stat().st_size // 2)
    else:
        (newest / RESUME_FILE).write_text('{"step": 12, "cursors": ')
    logs = {log: log.stat().st_size for log in rank_logs(checkpoints.parent)}
    return Damage(kind, newest, good[1], newest.stat().st_ino, logs)


def rank_logs(run_dir: Path) -> list[Path]:
    """The run's per-rank log files."""
    return sorted((run_dir / "logs").glob("rank*.log"))


def check_fallback(damage: Damage, text: str, run_dir: Path) -> list[str]:
    """Violations of the resume after `damage`: a rank that did not exit 0 (the launcher
    itself exits 1 on its SIGTERM), no warning naming the damaged checkpoint (on the
    console or in a rank's log), or a session that did not start from the newest good
    checkpoint."""
    problems = []
    for log in rank_logs(run_dir):
        with log.open("rb") as file:
            file.seek(damage.logs.get(log, 0))
            session = file.read().decode(errors="replace")
        text += session
        if "exiting with code 0" not in session:
            problems.append(f"{log.name}: the rank did not exit 0 after resuming")
    if f"skipping checkpoint {damage.checkpoint}" not in text:
        problems.append(f"no warning that {damage.checkpoint.name} was skipped")
    starts = [r for r in metric_records(run_dir / "metrics.jsonl") if r.get("event") == "start"]
    expected = read_resume_record(damage.fallback).step
    if not starts or starts[-1]["resumed_step"] != expected:
        found = starts[-1]["resumed_step"] if starts else None
        problems.append(f"resumed from step {found}, not from {damage.fallback.name}")
    return problems


def metric_records(metrics: Path) -> list[dict]:
    """The records of metrics.jsonl that parse (a cut last line is left out)."""
    records = []
    for line in metrics.read_text().splitlines() if metrics.exists() else []:
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records


def regen_command(url: str, chats: Path, output: Path, *extra: str) -> list[str]:
    """The `ringtrain-data regenerate` command line of one client."""
    command = [sys.executable, "-m", "ringtrain.cli.data", "regenerate", "--server", url]
    command += ["--model", MODEL, "--input", str(chats), "--output", str(output)]
    return [*command, "--no-progress", "--concurrency", "4", *extra]


def second_client(command: list[str], first: subprocess.Popen) -> list[str]:
    """Start a second client on the first one's output: violations unless it is refused
    naming the first client's pid."""
    second = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=CLIENT_TIMEOUT_S
    )
    owner = f"pid {first.pid} on host {socket.gethostname()}"
    if second.returncode != 2 or owner not in second.stderr:
        tail = second.stderr.strip().splitlines()[-1:] or ["no output"]
        return [f"second client exited {second.returncode}, not refused naming {owner}: {tail}"]
    return []


def resume_client(command: list[str], killed: int | None) -> list[str]:
    """Resume after the first client: violations unless it finishes and, when the first
    was killed holding the lock (`killed`: its pid), says it took that lock over."""
    resumed = subprocess.run(
        [*command, "--resume"], cwd=ROOT, capture_output=True, text=True, timeout=CLIENT_TIMEOUT_S
    )
    if resumed.returncode != 0:
        return [f"the resumed client exited {resumed.returncode}: {resumed.stderr[-400:]}"]
    if killed is not None and f"took over the lock of pid {killed}" not in resumed.stderr:
        return [f"the resumed client does not say it took over the lock of pid {killed}"]
    return []


def regen_round(result: Round, work: Path) -> str:
    """Play a regen round into `result` : sets the first client as the
    victim, the kill time and violations; returns what happened, for the round's line."""
    directory = work / f"regen{result.index:03d}"
    directory.mkdir(parents=True, exist_ok=True)
    chats, output = directory / "chats.jsonl", directory / "out.jsonl"
    good = write_chats(chats, REGEN_CHATS)
    hold = random.randint(1, REGEN_CHATS)
    with ChatServer(faults=Faults(hold_after=hold)) as server:
        command = regen_command(server.url, chats, output)
        started = time.monotonic()
        with (directory / "first.err").open("wb") as sink:
            first = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=sink)
        result.victim_pid = first.pid
        try:
            if not server.held.wait(CLIENT_TIMEOUT_S):
                result.violations.append(f"the first client never reached answer {hold}")
            else:
                result.violations += second_client(command, first)
            server.open_gate()
            killed = kill_later(first, random.uniform(0.0, REGEN_KILL_S))
            held = killed is not None and lock_holder(output) == killed
        finally:
            first.kill()
            first.wait()
        result.exit_code = first.returncode
        result.injected_s = time.monotonic() - started if killed else None
        result.violations += resume_client(command, killed if held else None)
    try:
        assert_all_regenerated(chats, output, good)
    except AssertionError as exc:
        result.violations.append(f"output of {REGEN_CHATS} lines: {exc}")
    ending = "SIGKILL holding the lock" if held else "finished" if killed is None else "SIGKILL"
    return f"held after {hold} answers, {ending}"


def lock_holder(output: Path) -> int | None:
    """The pid the output's lock file names (None: emptied, as a client that finished
    leaves it; a client killed after that held no lock)."""
    text = lock_path(output).read_text().strip() if lock_path(output).exists() else ""
    return json.loads(text)["pid"] if text else None


def kill_later(process: subprocess.Popen, delay: float) -> int | None:
    """SIGKILL `process` after `delay` s unless it ended first; returns its pid if killed."""
    try:
        process.wait(delay)
        return None
    except subprocess.TimeoutExpired:
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        return process.pid
