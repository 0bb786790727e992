"""Independent commands run in children of their own, all at once: a test that needs
several such processes (each mostly importing torch, or training on one core) lets the
cores share them instead of waiting for each in turn."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path


def run_at_once(
    commands: Mapping[str, Sequence[str]], cwd: Path, env: dict[str, str], timeout_s: float
) -> dict[str, subprocess.CompletedProcess[str]]:
    """Each command (its arguments after python) started at once, each waited for to its
    end (within ``timeout_s``); their results by name."""
    procs = {
        name: subprocess.Popen(
            [sys.executable, *command],
            cwd=cwd,
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for name, command in commands.items()
    }
    done = {}
    try:
        for name, proc in procs.items():
            stdout, stderr = proc.communicate(timeout=timeout_s)
            done[name] = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()
    return done
