"""The mutants of the dataset's Arrow files: how they are listed, named, read and checked (ringtrain/data/arrow_files.py)."""

from __future__ import annotations

GROUPS = ()
