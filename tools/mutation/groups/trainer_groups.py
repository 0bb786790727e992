"""The mutants of target groups and data parallelism (ringtrain/trainer/)."""

from __future__ import annotations

GROUPS = ()
