"""Configuration of the shared-memory ring ([ring] in the TOML config)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec


class RingConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Ring geometry, payload transport and failure-detection limits."""

    # "auto": device where every GPU pair has peer access, else host (see ring/payload.py).
    transport: Literal["auto", "device", "host"] = "auto"
    # Slots each target owns: batches it may have in flight before it waits for drafters.
    slots_per_producer: Annotated[int, msgspec.Meta(ge=1)] = 4
    # Seconds one blocking wait may last before peers are checked for liveness.
    wait_timeout_s: Annotated[float, msgspec.Meta(gt=0.0)] = 1.0
    # A peer whose heartbeat is older than this is declared dead (its process is frozen:
    # stopped, or a call holding the interpreter lock).
    heartbeat_timeout_s: Annotated[float, msgspec.Meta(gt=0.0)] = 30.0
    # A rank whose main thread makes no progress for this long in steady work (a step, a
    # batch, a wake-up in a ring wait) is hung: the run ends naming it (ring/phases.py).
    progress_timeout_s: Annotated[float, msgspec.Meta(gt=0.0)] = 45.0
    # The same allowance in start-up phases (loading, compiling, autotuning, the first
    # step) and while a checkpoint is written.
    startup_timeout_s: Annotated[float, msgspec.Meta(gt=0.0)] = 600.0
    # Directory for lock files (fcntl.lockf needs a real file).
    lock_dir: str = "/dev/shm"
