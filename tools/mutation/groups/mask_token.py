"""The mutants of the drafter's automatic mask token, chosen from the target's tokenizer (ringtrain/drafter/mask_token.py)."""

from __future__ import annotations

GROUPS = ()
