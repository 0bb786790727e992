"""The mutants of the target's layer structure and FLA configurations (ringtrain/target/)."""

from __future__ import annotations

GROUPS = ()
