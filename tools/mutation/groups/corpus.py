"""The mutants of the toy recipe's corpus, the Python standard library's own files (ringtrain/data/corpus.py)."""

from __future__ import annotations

GROUPS = ()
