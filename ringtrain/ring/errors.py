"""Exceptions raised by the ring; every message names the rank, its label and what to do."""

from __future__ import annotations


class RingError(RuntimeError):
    """Base class of every ring failure."""


class PeerDied(RingError):
    """Another rank of the ring died, failed or aborted; the run cannot continue.

    `rank` is the global rank of the dead peer, `label` what the run calls it (RingSpec.label),
    `last_error` the error text it recorded before dying (empty when it left none).
    `primary`: the rank's death or hang was seen directly (it is gone, stopped beating or
    made no progress), not through the error or abort it left after something else failed.
    """

    def __init__(
        self,
        message: str,
        rank: int = -1,
        label: str = "",
        last_error: str = "",
        primary: bool = False,
    ) -> None:
        super().__init__(message)
        self.rank = rank
        self.label = label
        self.last_error = last_error
        self.primary = primary


class RingClosed(RingError):
    """Every rank on the other side of the ring closed, so a wait can never end."""


class RingTimeout(RingError):
    """A wait given an explicit deadline passed it while every peer was still alive."""


class ShmTooSmall(RingError):
    """/dev/shm has too little free space for the ring's segments."""


class RankHung(PeerDied):
    """A rank of the ring made no progress for longer than its phase allows (phases.py):
    its main thread is stuck or its process is stopped. Raised by its peers, or by the
    rank's own watchdog about itself."""
