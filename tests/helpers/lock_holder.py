"""A process that holds an output's lock until it is killed (tests/test_regen_lock.py)."""

from __future__ import annotations

from multiprocessing.synchronize import Event
from pathlib import Path

from ringtrain.data.regen_lock import OutputLock


def hold_until_killed(output: str, locked: Event, never: Event) -> None:
    """Take the lock of `output`, say so through `locked`, then wait for `never`."""
    OutputLock(Path(output)).acquire()
    locked.set()
    never.wait()
