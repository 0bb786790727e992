"""The mutants of chat prompts rendered with the target's chat template as a server renders them (ringtrain/generate/chat.py)."""

from __future__ import annotations

GROUPS = ()
