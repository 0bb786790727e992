"""The mutants of the ring's payload memory and the packed batch (ringtrain/ring/, ringtrain/batch.py)."""

from __future__ import annotations

GROUPS = ()
