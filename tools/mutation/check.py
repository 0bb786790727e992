"""Mutation check: does the suite notice a one-line change to what users read?

    python -m tools.mutation.check --clone /tmp/mut            # every mutant
    python -m tools.mutation.check --clone /tmp/mut --only ties --only metrics
    python -m tools.mutation.check --list

It clones the project's committed state into --clone (a directory that must not exist
yet), then for each mutant in MUTANTS (mutants.py, from groups/) changes one line of one module in
the clone, runs that module's tests there (`python -m pytest -x` with the clone first on PYTHONPATH;
the tests marked slow or gpu left out), and puts the line back. A mutant is killed when the
tests fail. The tests of each group are first run on the unchanged clone: a group whose
tests fail already is reported and skipped. Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tools.mutation.mutant import Group
from tools.mutation.mutants import MUTANTS

ROOT = Path(__file__).resolve().parents[2]
PYTEST = ["-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-m", "not slow and not gpu"]


def run_tests(clone: Path, tests: tuple[str, ...], timeout_s: float) -> tuple[bool, float]:
    """(whether the tests passed, seconds) in `clone`."""
    env = {**os.environ, "PYTHONPATH": str(clone)}
    started = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, *PYTEST, *tests], cwd=clone, env=env,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=timeout_s,
        )  # fmt: skip
        passed = done.returncode == 0
    except subprocess.TimeoutExpired:
        passed = False
    return passed, time.monotonic() - started


def check_group(clone: Path, group: Group, timeout_s: float) -> list[dict]:
    """One result per mutant of `group` (none when its tests fail unchanged)."""
    passed, seconds = run_tests(clone, group.tests, timeout_s)
    print(f"{group.name}: unchanged tests {'pass' if passed else 'FAIL'} ({seconds:.0f} s)")
    if not passed:
        return [{"group": group.name, "mutant": "(unchanged)", "killed": None}]
    source = clone / group.module
    original = source.read_text()
    results = []
    for mutant in group.mutants:
        if original.count(mutant.old) != 1:
            raise SystemExit(f"{group.module}: the text of {mutant.label!r} is not there once")
        source.write_text(original.replace(mutant.old, mutant.new))
        try:
            survived, seconds = run_tests(clone, group.tests, timeout_s)
        finally:
            source.write_text(original)
        verdict = "survived" if survived else "killed"
        print(f"  {verdict:<8} {seconds:5.0f} s  {mutant.label}", flush=True)
        results.append(
            {"group": group.name, "module": group.module, "mutant": mutant.label,
             "killed": not survived, "seconds": round(seconds, 1)}
        )  # fmt: skip
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clone", type=Path, help="a directory to clone the project into")
    parser.add_argument("--only", action="append", default=[], help="groups whose name has this")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per test run")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    args = parser.parse_args(argv)
    groups = [g for g in MUTANTS if not args.only or any(o in g.name for o in args.only)]
    if args.list:
        for group in groups:
            print(f"{group.name} ({group.module}; {' '.join(group.tests)})")
            print("".join(f"  {m.label}\n" for m in group.mutants), end="")
        return 0
    if args.clone is None or args.clone.exists():
        parser.error("--clone must name a directory that does not exist yet")
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(args.clone)], check=True)
    results = [r for group in groups for r in check_group(args.clone, group, args.timeout)]
    judged = [r for r in results if r["killed"] is not None]
    killed = sum(r["killed"] for r in judged)
    print(f"{killed} of {len(judged)} mutants killed")
    print(json.dumps({"killed": killed, "mutants": len(judged), "results": results}))
    return 0 if killed == len(judged) == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
