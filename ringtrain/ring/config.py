"""Configuration of the shared-memory ring ([ring] in the TOML config)."""

from __future__ import annotations

from typing import Literal

import msgspec


class RingConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Ring geometry, payload transport and failure-detection limits."""

    # "auto": device where every GPU pair has peer access, else host (see ring/transport.py).
    transport: Literal["auto", "device", "host"] = "auto"
    slots_per_producer: int = 4
    # Seconds one blocking wait may last before peers are checked for liveness.
    wait_timeout_s: float = 1.0
    # A peer whose heartbeat is older than this is declared dead.
    heartbeat_timeout_s: float = 60.0
    # Directory for lock files (fcntl.lockf needs a real file).
    lock_dir: str = "/dev/shm"
