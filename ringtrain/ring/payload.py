"""Payload memory of the ring: where slots live, one class per transport.

Every transport implements the `Payload` protocol. The ring protocol (ring.py, ends.py)
uses four operations: `writer_views(slot)` (where a producer writes), `after_write(slot)`
(make the write visible before the slot turns READY), `reader_bytes(slot)` and
`before_read(slot, stream)` (what a consumer copies from: the slot's raw bytes, and what
its stream must wait for); around them, the transport's share of the ring's life
(create, open_producer, close). `TRANSPORTS` is the one table of transports, by the
name `ring.transport` gives (its index is the code the control block stores).
"""

from __future__ import annotations

from typing import ClassVar, Protocol

import torch

from ringtrain.choices import choice_table
from ringtrain.ring.config import RingConfig
from ringtrain.ring.control import ControlBlock
from ringtrain.ring.device_payload import DevicePayload
from ringtrain.ring.errors import RingError
from ringtrain.ring.host_payload import HostPayload
from ringtrain.ring.spec import RingSpec, SlotLayout


class Payload(Protocol):
    """The slots' memory as one rank sees it (see the module docstring)."""

    # Whether the memory goes with its producer: a closing producer waits for consumers.
    frees_slots_on_close: ClassVar[bool]

    @staticmethod
    def shm_bytes(spec: RingSpec, layout: SlotLayout) -> int:
        """Bytes the slots take in /dev/shm."""
        ...

    @staticmethod
    def create(spec: RingSpec, layout: SlotLayout) -> None:
        """Create the shared memory with the ring (creating rank only)."""
        ...

    def __init__(
        self, spec: RingSpec, layout: SlotLayout, device: torch.device, control: ControlBlock
    ) -> None: ...

    def open_producer(self, local_index: int, producer: int) -> None:
        """Set up the memory of producer `producer` (ring index `local_index`), once."""
        ...

    def writer_views(self, slot: int) -> dict[str, torch.Tensor]:
        """The producer's views of `slot`, by field name."""
        ...

    def after_write(self, slot: int) -> None:
        """Make the producer's writes into `slot` visible to consumers."""
        ...

    def reader_bytes(self, slot: int) -> torch.Tensor:
        """The raw bytes of `slot`, which a consumer copies a prefix of."""
        ...

    def before_read(self, slot: int, stream: torch.cuda.Stream | None) -> None:
        """Make the consumer's `stream` wait for the producer's writes into `slot`."""
        ...

    def close(self) -> None:
        """Release this rank's mappings (and a producer's own memory)."""
        ...


# "auto" picks one of the transports (resolve_transport).
AUTO = "auto"
TRANSPORTS: dict[str, type[Payload]] = choice_table(
    RingConfig, "transport", {"host": HostPayload, "device": DevicePayload}, beside=(AUTO,)
)


def transport_code(name: str) -> int:
    """The control block's code of transport `name`."""
    return list(TRANSPORTS).index(name)


def transport_name(code: int) -> str:
    """The transport of control-block code `code`."""
    return list(TRANSPORTS)[code]


def resolve_transport(requested: str, device: torch.device) -> tuple[str, str]:
    """(transport, reason) for a ring created on `device` with `requested` transport."""
    if requested not in (AUTO, *TRANSPORTS):
        raise RingError(
            f"ring.transport = {requested!r} is unknown: use one of {[AUTO, *TRANSPORTS]}"
        )
    if requested == "host":
        return "host", "requested in the config"
    usable = torch.cuda.is_available() and device.type == "cuda"
    if requested == "device":
        if not usable:
            raise RingError(
                "ring.transport = 'device' needs CUDA ranks, "
                f"but the creating rank runs on {device} "
                f"(CUDA available: {torch.cuda.is_available()}); use transport 'host' or 'auto'"
            )
        return "device", "requested in the config"
    if not usable:
        return "host", f"auto: ranks run on {device}, not on a CUDA GPU"
    count = torch.cuda.device_count()
    for a in range(count):
        for b in range(count):
            if a != b and not torch.cuda.can_device_access_peer(a, b):
                return (
                    "host",
                    f"auto: GPUs {a} and {b} have no peer access, so CUDA IPC cannot cross them",
                )
    return "device", "auto: CUDA IPC between GPUs with peer access"
