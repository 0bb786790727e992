"""The mutants of the drafter's shape and its limits (ringtrain/drafter/spec.py, ringtrain/drafter/limits.py)."""

from __future__ import annotations

GROUPS = ()
