"""The mutants of exact resume: what a checkpoint records of the run, how a resume reads it back and what it loads (ringtrain/checkpoint/resume_record.py, resume.py, load.py)."""

from __future__ import annotations

GROUPS = ()
