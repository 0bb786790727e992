"""The mutants of speculative decoding at a temperature, the trained drafter as a block drafter, prompt files and generation models."""

from __future__ import annotations

GROUPS = ()
