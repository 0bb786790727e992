"""The mutants of synthesis's generators, templates and outputs (ringtrain/data/)."""

from __future__ import annotations

GROUPS = ()
