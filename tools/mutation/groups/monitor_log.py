"""The mutants of the run's log, verdict and scalars (ringtrain/monitor/)."""

from __future__ import annotations

GROUPS = ()
