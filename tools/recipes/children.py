"""The real-model recipes' child processes: started together, waited for, and stopped
with the recipe.

A recipe runs its steps as child processes (regeneration, torchrun, ringtrain-eval).
When the recipe is stopped (Ctrl-C, or SIGTERM once ``stop_children_on_sigterm`` is in
place) the children still running get SIGTERM (torchrun passes it to its ranks, which
checkpoint and exit) and, after a grace period, SIGKILL: none is left running.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path

# Seconds a stopped child has to exit after SIGTERM (a drafter rank writes a checkpoint).
GRACE_S = 60


def run_all(commands: dict[str, list[str]], cwd: Path) -> dict[str, subprocess.CompletedProcess]:
    """Run the commands at once in ``cwd`` (outputs to stderr, stdout kept); wait for
    every one. If the wait is interrupted, the children still running are stopped."""
    return wait_all(start_all(commands, cwd))


def start_all(commands: dict[str, list[str]], cwd: Path) -> dict[str, subprocess.Popen]:
    """Start the commands in ``cwd`` (outputs to stderr, stdout kept for ``wait_all``);
    a caller that does other work before ``wait_all`` stops them when that work fails."""
    procs: dict[str, subprocess.Popen] = {}
    try:
        for name, command in commands.items():
            print(f"[real_recipe] {name}: {' '.join(command)}", file=sys.stderr, flush=True)
            procs[name] = subprocess.Popen(
                command, cwd=cwd, stdout=subprocess.PIPE, stderr=sys.stderr, text=True
            )
    except BaseException:
        stop(procs.values())
        raise
    return procs


def wait_all(procs: dict[str, subprocess.Popen]) -> dict[str, subprocess.CompletedProcess]:
    """Wait for every started child; if the wait is interrupted, stop those still running."""
    try:
        done = {}
        for name, proc in procs.items():
            stdout, _ = proc.communicate()
            done[name] = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, "")
        return done
    except BaseException:
        stop(procs.values())
        raise


def stop(procs: Iterable[subprocess.Popen]) -> None:
    """SIGTERM to the live ones, SIGKILL to those still alive after ``GRACE_S``."""
    live = [proc for proc in procs if proc.poll() is None]
    for proc in live:
        proc.terminate()
    deadline = time.monotonic() + GRACE_S
    for proc in live:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def stop_children_on_sigterm() -> None:
    """SIGTERM ends the recipe as Ctrl-C does (an exception in the main thread), so the
    children are stopped on the way out."""
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
