"""The mutants of ringtrain-stat, synthesize's and convert-gguf's command lines and the configuration reference."""

from __future__ import annotations

GROUPS = ()
