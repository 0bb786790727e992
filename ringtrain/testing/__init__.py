"""Fixtures shared by the test suite and the benchmark and recipe scripts.

A deterministic OpenAI-compatible chat server with injectable faults, chat records with
the regenerated output each should give, and a start-up hook that makes a process's main
thread hang on SIGUSR1. Training never imports this package.
"""

from pathlib import Path

# Put first on a child's PYTHONPATH: its sitecustomize makes SIGUSR1 hang the main thread.
SPIN_HOOK = Path(__file__).resolve().parent / "spin_hook"
