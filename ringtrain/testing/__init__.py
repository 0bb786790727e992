"""Fixtures shared by the test suite and the benchmark and recipe scripts.

A deterministic OpenAI-compatible chat server with injectable faults, chat records with
the regenerated output each should give, a start-up hook that makes a process's main
thread hang on SIGUSR1 (at once) or SIGUSR2 (inside its next wait on its peers), and one
that makes a named function raise torch.OutOfMemoryError after SIGUSR1. Training never
imports this package.
"""

from pathlib import Path

# Put first on a child's PYTHONPATH: its sitecustomize makes SIGUSR1 (SIGUSR2) hang the main
# thread at once (at the end of its next wait on its peers).
SPIN_HOOK = Path(__file__).resolve().parent / "spin_hook"
# Put first on a child's PYTHONPATH with RINGTRAIN_FAIL_ALLOCATION_IN naming a function: its
# sitecustomize makes SIGUSR1 arm that function's next call to raise torch.OutOfMemoryError.
OOM_HOOK = Path(__file__).resolve().parent / "oom_hook"
