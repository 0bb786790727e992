"""A bounded soak of the failure handling: faults at random moments, resumes, and checks.

    python -m tools.recipes.chaos_run [--rounds 40] [--seed 0] [--faults kill,stop,...]
                                      [--work-dir DIR] [--json FILE]

Each round starts the embedded default (`torchrun --standalone --nproc-per-node 3 -m
ringtrain.main`, small checkpoint interval, resuming once the run directory exists) in
one run directory, injects one fault at a random time after launch, and waits for the
whole run to end:

    kill     SIGKILL of a random rank
    stop     SIGSTOP of a random rank
    term     SIGTERM to the launcher (as a scheduler's preemption sends it)
    stuck    a random rank's main thread blocks for good while its other threads live
             (SIGUSR1 through ringtrain/testing/spin_hook, which every process loads from
             PYTHONPATH)
    stuckpeer  a random drafter's main thread blocks so at the end of its next gradient
             reduction, while the other drafter goes on and waits for it (SIGUSR2): a
             group that waits on itself (ring/phases.py, deadlock)
    corrupt  the newest good checkpoint damaged before the launch, which is then ended
             by a SIGTERM (chaos_faults.py says how, and what is checked)
    regen    no training run: two `ringtrain-data regenerate` clients on one output, the
             second refused, the first SIGKILLed and resumed (chaos_faults.py)

`--faults` picks the kinds drawn from (default: all). `stop` waits until the ranks have
joined the ring (before that a rank's peers wait for it in the rendezvous), `stuck`,
`stuckpeer` and `corrupt` until every rank runs its loop (a main thread stuck while
loading or compiling is allowed ring.startup_timeout_s, 600 s, by design). Afterwards it checks,
over all rounds: every stop took at most 60 s (fault to launcher exit) and, for a fault of one
rank, the output named that rank (its pid); no batch was trained twice or skipped (the
step records of metrics.jsonl, each step superseded by its resumed replay, against the
newest good checkpoint's cursors); no checkpoint holds a non-finite weight (a damaged
one not written again since is left out); no process of the run is left and /dev/shm
holds nothing of it. Prints one line per round, a summary table, and the JSON last
(`chaos_rounds`, `chaos_violations`, per fault counts and stop times). Not part of the
test suite: a round takes 30-90 s on CPU (a regen round about 20 s).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors.torch import load_file

from ringtrain.checkpoint import StreamCursor, latest_checkpoint, read_resume_record
from ringtrain.checkpoint.layout import STEP_DIR, WEIGHTS_FILE
from ringtrain.ring import RingReader, discover
from ringtrain.ring.liveness import process_state
from ringtrain.testing import SPIN_HOOK
from ringtrain.trainer.phases import WORK
from tools.recipes.chaos_faults import (
    Damage,
    Round,
    check_fallback,
    damage_newest,
    metric_records,
    regen_round,
)

FAULTS = ("kill", "stop", "term", "stuck", "stuckpeer", "corrupt", "regen")
SIGNALS = {
    "kill": signal.SIGKILL,
    "stop": signal.SIGSTOP,
    "stuck": signal.SIGUSR1,
    "stuckpeer": signal.SIGUSR2,
}
UNDAMAGED = "fewer than two good checkpoints: nothing damaged"
GENTLE = ("term", "corrupt")  # rounds whose run ends by the launcher's SIGTERM: exit 0
STOP_LIMIT_S = 60.0  # the promise: a fault ends the whole run within this
GIVE_UP_S = 180.0  # a run still alive this long after its fault is killed (a violation)
POLL_S = 0.1


def torchrun_command(run_dir: Path, name: str, resume: bool, max_steps: int, every: int) -> list:
    settings = {
        "run.run_dir": json.dumps(str(run_dir)),
        "run.name": json.dumps(name),
        "run.device": '"cpu"',
        "run.max_steps": max_steps,
        "run.checkpoint_every": every,
        "run.log_every": 1,
        "run.eval_every": 0,
    }
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node", "3", "-m", "ringtrain.main"]
    for key, value in settings.items():
        command += ["--set", f"{key}={value}"]
    return command + (["--resume"] if resume else [])


def run_env() -> dict[str, str]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SPIN_HOOK), env.get("PYTHONPATH")) if p)
    return env


def workers(launcher: int) -> dict[int, int]:
    """{global rank: pid} of the launcher's worker processes (from /proc)."""
    found = {}
    for task in Path(f"/proc/{launcher}/task").glob("*"):
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for pid in map(int, children):
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            for entry in environ:
                if entry.startswith(b"RANK="):
                    found[int(entry[5:])] = pid
    return found


def ring_ranks(name: str) -> list | None:
    """The snapshot of each rank of the run's ring, once it exists and every rank maps it."""
    rings = [r for r in discover() if r.run.startswith(f"{name}-") and len(r.pids) == 3]
    if not rings:
        return None
    reader = RingReader(rings[0])
    try:
        return reader.snapshot().ranks
    finally:
        reader.close()


def ring_up(name: str, running: bool = False) -> bool:
    """Whether the run's ring exists and every rank maps it (and, with `running`, every
    rank made progress in its loop)."""
    ranks = ring_ranks(name)
    if ranks is None or not running:
        return ranks is not None
    return all(r.doing == WORK[r.label] for r in ranks)


def wait_until(condition, deadline: float, proc: subprocess.Popen) -> bool:
    """Poll `condition` until it holds (True) or the run ended or the deadline passed."""
    while time.monotonic() < deadline and proc.poll() is None:
        if condition():
            return True
        time.sleep(POLL_S)
    return False


def inject(result: Round, proc: subprocess.Popen, name: str, started: float) -> dict[int, int]:
    """Deliver the round's fault; returns the workers then ({}: the run ended before)."""
    wait_until(lambda: False, started + result.planned_s, proc)
    give_up = time.monotonic() + GIVE_UP_S
    if result.fault in ("stop", "stuck", "stuckpeer", "corrupt"):
        wait_until(lambda: ring_up(name, result.fault != "stop"), give_up, proc)
    wait_until(lambda: len(workers(proc.pid)) == 3, give_up, proc)
    ranks = workers(proc.pid)
    if proc.poll() is not None or len(ranks) != 3:
        return {}
    if result.fault in GENTLE:
        proc.send_signal(signal.SIGTERM)
    else:
        chosen = sorted(ranks)
        if result.fault == "stuckpeer":  # only drafters wait on their peers
            chosen = sorted(r.rank for r in ring_ranks(name) or [] if r.label == "drafter")
        result.victim_rank = random.choice(chosen)
        result.victim_pid = ranks[result.victim_rank]
        os.kill(result.victim_pid, SIGNALS[result.fault])
    result.injected_s = time.monotonic() - started
    return ranks


def run_round(result: Round, args: argparse.Namespace, run_dir: Path, name: str) -> str:
    """Launch, inject, wait for the end; returns the run's output."""
    output = run_dir.parent / f"round{result.index:03d}.out"
    resume = run_dir.exists()  # the first launch starts fresh
    command = torchrun_command(run_dir, name, resume, args.max_steps, args.every)
    with output.open("wb") as sink:
        proc = subprocess.Popen(
            command, env=run_env(), stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
    started = time.monotonic()
    pids = inject(result, proc, name, started)
    fault_time = time.monotonic()
    try:
        proc.wait(GIVE_UP_S)
    except subprocess.TimeoutExpired:
        result.violations.append(f"run still alive {GIVE_UP_S:.0f} s after the fault")
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    result.exit_code = proc.returncode
    if pids:
        result.stop_s = time.monotonic() - fault_time
    left = [pid for pid in pids.values() if process_state(pid) not in ("", "Z", "X")]
    if left:
        result.violations.append(f"processes {left} outlived the launcher")
        for pid in left:
            os.kill(pid, signal.SIGKILL)
    return output.read_text(errors="replace")


def judge_round(result: Round, text: str, name: str) -> None:
    """Record the round's violations: slow stop, unnamed victim, leftovers in /dev/shm."""
    if result.injected_s is None:
        if result.exit_code != 0:
            result.violations.append(f"no fault injected, yet exit code {result.exit_code}")
        return
    if result.stop_s is not None and result.stop_s > STOP_LIMIT_S:
        result.violations.append(f"stop took {result.stop_s:.1f} s (> {STOP_LIMIT_S:.0f})")
    if result.victim_pid is not None:
        ours = re.search(rf"rank {result.victim_rank} \(\w+, pid {result.victim_pid}\)", text)
        launcher = f"(pid: {result.victim_pid})" in text
        result.named = bool(ours or launcher)
        if not result.named:
            result.violations.append(f"output never names rank {result.victim_rank}")
    if result.fault not in GENTLE and result.exit_code == 0:
        result.violations.append("a run with a failed rank exited 0")
    leaked = [e for e in os.listdir("/dev/shm") if f"ringtrain.{name}-" in e]
    if leaked:
        result.violations.append(f"/dev/shm holds {leaked}")


def lineage(metrics: Path) -> list[dict]:
    """The step records that stand: a resumed session's step s supersedes every earlier
    record of step s and later (those steps were lost with the crash and trained again)."""
    kept: list[dict] = []
    # A cut last line is left out: the writer's problem, reported by its own tests.
    for record in metric_records(metrics):
        if record.get("event") == "step":
            while kept and kept[-1]["step"] >= record["step"]:
                kept.pop()
            kept.append(record)
    return kept


def check_batches(run_dir: Path) -> tuple[list[str], int]:
    """Violations of exactly-once training up to the newest checkpoint, and its step."""
    checkpoint = latest_checkpoint(run_dir / "checkpoints")
    if checkpoint is None:
        return [], 0
    resume = read_resume_record(checkpoint)
    step = resume.step
    records = [r for r in lineage(run_dir / "metrics.jsonl") if r["step"] <= step]
    problems = []
    if [r["step"] for r in records] != list(range(1, step + 1)):
        problems.append(f"step records up to checkpoint step {step} are not steps 1..{step}")
    trained: dict[int, list[int]] = defaultdict(list)
    for record in records:
        for producer, seq, _batch_id in record["batches"]:
            trained[int(producer)].append(int(seq))
    for producer, seqs in sorted(trained.items()):
        if len(seqs) != len(set(seqs)):
            twice = sorted({s for s in seqs if seqs.count(s) > 1})
            problems.append(f"target {producer}: batches {twice[:10]} trained twice")
        cursor = resume.cursors.get(producer, StreamCursor())
        expected = set(range(cursor.start)) | set(cursor.skip)
        if set(seqs) != expected:
            missing = sorted(expected - set(seqs))[:10]
            extra_seqs = sorted(set(seqs) - expected)[:10]
            problems.append(
                f"target {producer}: skipped {missing} / not in the checkpoint {extra_seqs}"
            )
    return problems, step


def check_weights(run_dir: Path, damaged: list[Damage]) -> tuple[list[str], int]:
    """Checkpoints holding a non-finite weight, and how many checkpoints were read (not
    those `damaged` by corrupt rounds and not written again since)."""
    problems, count = [], 0
    left = {d.checkpoint for d in damaged if d.still_there()}
    for directory in sorted((run_dir / "checkpoints").glob("step_*")):
        if not STEP_DIR.match(directory.name) or not (directory / WEIGHTS_FILE).exists():
            continue
        if directory in left:
            continue
        count += 1
        weights = load_file(directory / WEIGHTS_FILE)
        bad = [k for k, v in weights.items() if not bool(torch.isfinite(v).all())]
        if bad:
            problems.append(f"{directory.name}: non-finite weights in {bad[:5]}")
    return problems, count


def summarise(
    rounds: list[Round], faults: list[str], final: list[str], steps: int, checkpoints: int
) -> dict:
    """The campaign's figures per fault kind, its violations and every round."""
    by_fault: dict[str, dict] = {}
    for fault in faults:
        mine = [r for r in rounds if r.fault == fault]
        stops = [round(r.stop_s, 1) for r in mine if r.stop_s is not None]
        by_fault[fault] = {
            "rounds": len(mine),
            "injected": sum(r.injected_s is not None and r.detail != UNDAMAGED for r in mine),
            "stop_s": stops,
            "max_stop_s": max(stops, default=None),
        }
    violations = [f"round {r.index}: {v}" for r in rounds for v in r.violations] + final
    return {
        "chaos_rounds": len(rounds),
        "chaos_violations": len(violations),
        "violations": violations,
        "faults": by_fault,
        "steps_checkpointed": steps,
        "checkpoints_checked": checkpoints,
        "rounds": [asdict(r) for r in rounds],
    }


def print_table(summary: dict) -> None:
    print(f"\n{'fault':<6} {'rounds':>6} {'injected':>8} {'max stop s':>10}  stop times (s)")
    for fault, figures in summary["faults"].items():
        worst = figures["max_stop_s"]
        print(
            f"{fault:<6} {figures['rounds']:>6} {figures['injected']:>8} "
            f"{'-' if worst is None else f'{worst:.1f}':>10}  {figures['stop_s']}"
        )
    print(
        f"rounds {summary['chaos_rounds']}, violations {summary['chaos_violations']}, "
        f"steps checkpointed {summary['steps_checkpointed']}, "
        f"checkpoints checked {summary['checkpoints_checked']}"
    )
    for violation in summary["violations"]:
        print(f"  violation: {violation}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work-dir", help="where the run directory goes (default: a temp dir)")
    parser.add_argument("--json", help="also write the JSON summary to this file")
    parser.add_argument("--latest", type=float, default=35.0, help="latest fault time (s)")
    parser.add_argument("--max-steps", type=int, default=100_000)
    parser.add_argument("--every", type=int, default=4, help="run.checkpoint_every")
    parser.add_argument(
        "--faults", type=fault_kinds, default=list(FAULTS), help=f"kinds drawn from: {FAULTS}"
    )
    return parser.parse_args(argv)


def fault_kinds(text: str) -> list[str]:
    """The comma-separated fault kinds of --faults, each one of FAULTS."""
    kinds = [k.strip() for k in text.split(",") if k.strip()]
    unknown = sorted(set(kinds) - set(FAULTS))
    if unknown or not kinds:
        raise argparse.ArgumentTypeError(f"unknown fault kinds {unknown}; known: {FAULTS}")
    return list(dict.fromkeys(kinds))


def play_round(
    result: Round, args: argparse.Namespace, work: Path, name: str, damaged: list[Damage]
) -> None:
    """Play one round of any kind into `result` (a corrupt round's damage goes to
    `damaged`) and print its line."""
    run_dir = work / "run"
    if result.fault == "regen":
        result.detail = regen_round(result, work)
    else:
        damage = damage_newest(run_dir / "checkpoints") if result.fault == "corrupt" else None
        if result.fault == "corrupt":
            result.detail = f"{damage.kind} {damage.checkpoint.name}" if damage else UNDAMAGED
        text = run_round(result, args, run_dir, name)
        judge_round(result, text, name)
        if damage is not None:
            damaged.append(damage)
            result.violations += check_fallback(damage, text, run_dir)
    victim = f"pid {result.victim_pid}" if result.fault == "regen" else f"rank {result.victim_rank}"
    print(
        f"round {result.index}: {result.fault} {result.detail or victim} at "
        f"{result.injected_s or 0:.1f} s -> ended after {result.stop_s or 0:.1f} s, "
        f"exit {result.exit_code}, violations {result.violations or 'none'}",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    random.seed(args.seed)
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="chaos-"))
    work.mkdir(parents=True, exist_ok=True)
    run_dir, name = work / "run", f"chaos{os.getpid()}"
    rounds: list[Round] = []
    damaged: list[Damage] = []
    for index in range(args.rounds):
        fault = random.choice(args.faults)
        result = Round(index, fault, round(random.uniform(1.0, args.latest), 1))
        play_round(result, args, work, name, damaged)
        rounds.append(result)
    batch_problems, steps = check_batches(run_dir)
    weight_problems, checkpoints = check_weights(run_dir, damaged)
    final = batch_problems + weight_problems
    summary = summarise(rounds, args.faults, final, steps, checkpoints)
    print_table(summary)
    text = json.dumps(summary, indent=1)
    if args.json:
        Path(args.json).write_text(text)
    print(json.dumps({k: v for k, v in summary.items() if k != "rounds"}))
    return 0 if summary["chaos_violations"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
