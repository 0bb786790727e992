"""The mutants of ringtrain-eval's worker processes: tasks handed out as workers pull them, reports passed on, a dead worker named (ringtrain/eval/processes.py)."""

from __future__ import annotations

GROUPS = ()
