"""The mutants of a local model for generation: its loading, device, dtype, threads, context and token defaults (ringtrain/generate/local_model.py)."""

from __future__ import annotations

GROUPS = ()
