"""Benchmark the console scripts' start-up: seconds until `ringtrain-X --help` exits.

A command that answers `--help` (or refuses a bad argument) should do so before it
imports torch or transformers: under a second on a CPU. Each command named (default: the
console scripts `ringtrain-stat`, `ringtrain-eval` and `ringtrain-data`; `--all`: every
console script in pyproject.toml) is started as the installed script, after one warm-up
run, `--runs` times in turn; the report gives the median, min and max wall seconds of
each, its exit statuses, and the median CPU seconds (user + system, which a machine busy with other
work inflates less than wall time). The commands run with a bytecode cache of their own (a
temporary PYTHONPYCACHEPREFIX, PYTHONDONTWRITEBYTECODE unset): the warm-up compiles the
sources, the timed runs read the cache, as with an installed package. One more run per command,
through its entry point under `python -c`, records which of torch and transformers the command
imported before it exited.

    python -m tools.bench.bench_help --runs 10
    python -m tools.bench.bench_help --all --argument=--no-such-option
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tools.bench.bench_report import print_report

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_COMMANDS = ("ringtrain-stat", "ringtrain-eval", "ringtrain-data")
HEAVY = ("torch", "transformers")
# Runs the entry point as the installed script does, then says at exit which heavy
# packages were imported (argparse's --help and its refusals leave through sys.exit).
PROBE = """\
import atexit, importlib, sys
module, function, name, argument, heavy = sys.argv[1:6]
atexit.register(lambda: print("IMPORTED", *[m for m in heavy.split(",") if m in sys.modules]))
sys.argv = [name, argument]
getattr(importlib.import_module(module), function)()
"""


def console_scripts() -> dict[str, str]:
    """Console script name -> "module:function", from pyproject.toml."""
    with (ROOT / "pyproject.toml").open("rb") as file:
        return tomllib.load(file)["project"]["scripts"]


def script_path(name: str) -> Path:
    """The installed script beside this interpreter (the project's environment)."""
    return Path(sys.executable).parent / name


def child_env(cache: str) -> dict[str, str]:
    """This environment with bytecode cached under `cache`."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPYCACHEPREFIX": cache}


def cpu_of_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_once(command: list[str], env: dict[str, str]) -> tuple[float, float, int]:
    """(wall, CPU) seconds from the start of `command` to its exit (its output discarded),
    and its exit status."""
    cpu, started = cpu_of_children(), time.perf_counter()
    done = subprocess.run(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, check=False
    )
    return time.perf_counter() - started, cpu_of_children() - cpu, done.returncode


def imported_heavy(name: str, entry: str, argument: str, env: dict[str, str]) -> list[str]:
    """Which of HEAVY the command imported before it exited."""
    module, function = entry.split(":")
    probe = [sys.executable, "-c", PROBE, module, function, name, argument, ",".join(HEAVY)]
    out = subprocess.run(probe, capture_output=True, text=True, env=env, check=False).stdout
    lines = [line.split()[1:] for line in out.splitlines() if line.startswith("IMPORTED")]
    return lines[-1] if lines else ["(no report: the command did not exit through Python)"]


def measure(names: list[str], argument: str, runs: int, env: dict[str, str]) -> dict:
    """The report: per command, wall seconds over `runs` runs (after one warm-up) and the
    heavy packages it imported."""
    entries = console_scripts()
    commands = {name: [str(script_path(name)), argument] for name in names}
    for command in commands.values():
        run_once(command, env)
    times: dict[str, list[tuple[float, float, int]]] = {name: [] for name in names}
    for _ in range(runs):
        for name, command in commands.items():
            times[name].append(run_once(command, env))
    report: dict = {"argument": argument, "runs": runs, "cpus": os.cpu_count()}
    report["load_average_1min"] = round(os.getloadavg()[0], 2)
    for name in names:
        wall, cpu, codes = zip(*times[name], strict=True)
        report[f"{name}_median_s"] = round(statistics.median(wall), 3)
        report[f"{name}_min_max_s"] = [round(min(wall), 3), round(max(wall), 3)]
        report[f"{name}_median_cpu_s"] = round(statistics.median(cpu), 3)
        report[f"{name}_exit_codes"] = sorted(set(codes))
        report[f"{name}_imports"] = imported_heavy(name, entries[name], argument, env)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "commands", nargs="*", help=f"console scripts (default: {DEFAULT_COMMANDS})"
    )
    parser.add_argument("--all", action="store_true", help="every console script of the project")
    parser.add_argument("--runs", type=int, default=5, help="timed runs per command (default 5)")
    parser.add_argument("--argument", default="--help", help="the one argument (default --help)")
    args = parser.parse_args()
    known = console_scripts()
    names = list(known) if args.all else args.commands or list(DEFAULT_COMMANDS)
    unknown = [name for name in names if name not in known]
    if unknown or args.runs < 1:
        parser.error(f"unknown console scripts {unknown}" if unknown else "--runs must be >= 1")
    absent = [str(script_path(name)) for name in names if not script_path(name).exists()]
    if absent:
        parser.error(f"{', '.join(absent)} not installed: run pip install -e . first")
    with tempfile.TemporaryDirectory(prefix="bench-help-pycache-") as cache:
        report = measure(names, args.argument, args.runs, child_env(cache))
    print_report(report, "bench_help")


if __name__ == "__main__":
    main()
