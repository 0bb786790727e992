"""The mutants of the target loop's runner, the built-in tiny target and the Gated DeltaNet choice (ringtrain/target/)."""

from __future__ import annotations

GROUPS = ()
