"""The README's first command as a newcomer runs it, timed: the embedded default in an empty
directory with the README's process count, on whatever device the machine has.

    python -m tools.bench.bench_first_hour --json [--nproc 3] [--quickstart]

Runs ``torchrun --standalone --nproc-per-node N -m ringtrain.main`` in a new empty
directory and reports the exit status, the seconds from the command's start to the first
drafter step record in the run's metrics.jsonl (``first_step_s``), the whole run's
seconds and the last held-out tau_sim. ``--quickstart`` then runs ``bash
launch/quickstart.sh`` the same way (with the environment that $RINGTRAIN_VENV names,
where the machine cannot install one). Prints a short table last; JSON to
$OUT/bench_first_hour.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tools.bench.bench_report import save_report

ROOT = Path(__file__).resolve().parents[2]
RUN_DIR = Path("runs") / "tiny"


def _records(metrics: Path) -> list[dict]:
    if not metrics.is_file():
        return []
    return [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]


def timed_run(command: list[str], cwd: Path, limit_s: float) -> dict:
    """Run ``command`` in ``cwd``; poll the run's metrics.jsonl for its first step record."""
    metrics = cwd / RUN_DIR / "metrics.jsonl"
    started = time.perf_counter()
    log = (cwd / "console.log").open("w")
    proc = subprocess.Popen(command, cwd=cwd, stdout=log, stderr=subprocess.STDOUT)
    first_step = None
    while proc.poll() is None and time.perf_counter() - started < limit_s:
        if first_step is None and any(r.get("event") == "step" for r in _records(metrics)):
            first_step = time.perf_counter() - started
        time.sleep(0.2)
    if proc.poll() is None:
        proc.kill()
    code = proc.wait()
    total = time.perf_counter() - started
    records = _records(metrics)
    if first_step is None and any(r.get("event") == "step" for r in records):
        first_step = total
    evals = [r for r in records if r.get("event") == "eval" and "tau_sim" in r]
    console = (cwd / "console.log").read_text().splitlines()
    keep_logs(cwd)
    return {
        "command": " ".join(command),
        "exit": code,
        "first_step_s": None if first_step is None else round(first_step, 1),
        "total_s": round(total, 1),
        "steps": sum(r.get("event") == "step" for r in records),
        "held_out_tau_sim": evals[-1]["tau_sim"] if evals else None,
        "console_tail": console[-8:],
    }


def keep_logs(cwd: Path) -> None:
    """Copy the run's console and rank logs under $OUT/<directory name> (when $OUT is set)."""
    if not os.environ.get("OUT"):
        return
    kept = Path(os.environ["OUT"], cwd.name)
    kept.mkdir(parents=True, exist_ok=True)
    shutil.copy(cwd / "console.log", kept)
    if (cwd / RUN_DIR / "logs").is_dir():
        shutil.copytree(cwd / RUN_DIR / "logs", kept / "logs", dirs_exist_ok=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nproc", type=int, default=3)
    parser.add_argument("--limit-s", type=float, default=240.0)
    parser.add_argument("--quickstart", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    results = {}
    with tempfile.TemporaryDirectory(prefix="ringtrain-first-hour-") as empty:
        results["embedded_default"] = timed_run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone",
             "--nproc-per-node", str(args.nproc), "-m", "ringtrain.main"],
            Path(empty), args.limit_s,
        )  # fmt: skip
    if args.quickstart:
        with tempfile.TemporaryDirectory(prefix="ringtrain-quickstart-") as clone:
            # Times kept: a pyproject.toml newer than the environment's install stamp
            # makes the quickstart reinstall, which needs a package index.
            subprocess.run(["cp", "-a", f"{ROOT}/.", clone], check=True)
            results["quickstart"] = timed_run(
                ["bash", "launch/quickstart.sh"], Path(clone), args.limit_s
            )
    if args.json:
        save_report(results, "bench_first_hour", print_line=False)
    for name, result in results.items():
        print(
            f"{name:<18} exit {result['exit']:>3}  first step {result['first_step_s']} s  "
            f"total {result['total_s']} s  steps {result['steps']}  "
            f"tau_sim {result['held_out_tau_sim']}"
        )
    return 0 if all(r["exit"] == 0 for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
