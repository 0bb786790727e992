"""The mutants of regenerate --local's decoding drivers and its run lock (ringtrain/data/regen_drivers.py, ringtrain/data/regen_lock.py)."""

from __future__ import annotations

GROUPS = ()
