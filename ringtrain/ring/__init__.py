"""The shared-memory ring: control plane, slot protocol and payload transports.

The protocol is documented in ringtrain/ring/ring.py; the control block layout in
control.py; read-only statistics (for ringtrain-stat and progress lines) in snapshot.py.
"""

from ringtrain.ring.ends import Consumer, Producer, ReadItem, WriteSlot
from ringtrain.ring.errors import (
    PeerDied,
    RankHung,
    RingClosed,
    RingError,
    RingTimeout,
    ShmTooSmall,
)
from ringtrain.ring.ring import Ring, open_rings
from ringtrain.ring.snapshot import (
    RankSnapshot,
    RingLocation,
    RingReader,
    RingSnapshot,
    discover,
    open_ring,
    with_interval,
)
from ringtrain.ring.spec import CONSUMER, PRODUCER, RingSpec

__all__ = [
    "CONSUMER",
    "PRODUCER",
    "Consumer",
    "PeerDied",
    "Producer",
    "RankHung",
    "RankSnapshot",
    "ReadItem",
    "Ring",
    "RingClosed",
    "RingError",
    "RingLocation",
    "RingReader",
    "RingSnapshot",
    "RingSpec",
    "RingTimeout",
    "ShmTooSmall",
    "WriteSlot",
    "discover",
    "open_ring",
    "open_rings",
    "with_interval",
]
