"""The device transport: one cudaMalloc slab per producer on its GPU, shared by CUDA IPC.

A producer allocates its slab and one interprocess event per slot and publishes their
IPC handles in its rank-table row; consumers open them on first use and copy a slot's
used prefix GPU to GPU after waiting on the slot's event. See payload.py for the
operations.
"""

from __future__ import annotations

from typing import ClassVar

import msgspec
import torch

from ringtrain.ring import cuda
from ringtrain.ring.control import ControlBlock, get_bytes, put_bytes
from ringtrain.ring.errors import RingError
from ringtrain.ring.spec import RingSpec, SlotLayout

SLAB_PAGE = 2 << 20


class _Export(msgspec.Struct, array_like=True):
    """What a producer publishes once about its slab: IPC handles and geometry."""

    slab: bytes
    nbytes: int
    device: int
    events: list[bytes]


class _Import:
    """A consumer's cached mapping of one producer's slab and events."""

    def __init__(self, export: _Export, device: torch.device) -> None:
        self.ptr = cuda.ipc_open_handle(export.slab, device)
        self.slab = cuda.wrap_device_pointer(self.ptr, export.nbytes)
        self.events = [torch.cuda.Event.from_ipc_handle(device, h) for h in export.events]


class DevicePayload:
    """One cudaMalloc slab per producer on its GPU, shared through CUDA IPC handles."""

    # A slab is freed when its producer closes: consumers must copy out what it published.
    frees_slots_on_close: ClassVar[bool] = True

    @staticmethod
    def shm_bytes(spec: RingSpec, layout: SlotLayout) -> int:
        """Nothing in /dev/shm: the slots are in GPU memory."""
        return 0

    @staticmethod
    def create(spec: RingSpec, layout: SlotLayout) -> None:
        """Nothing to create with the ring: each producer allocates its slab (open_producer)."""

    def __init__(
        self, spec: RingSpec, layout: SlotLayout, device: torch.device, control: ControlBlock
    ) -> None:
        self.spec, self.layout, self.device, self.control = spec, layout, device, control
        self._own_ptr = 0
        self._first = 0
        self._own_events: list[torch.cuda.Event] = []
        self._own_views: list[dict[str, torch.Tensor]] = []
        self._imports: dict[int, _Import] = {}
        self._import_bytes: dict[int, torch.Tensor] = {}

    def open_producer(self, local_index: int, producer: int) -> None:
        """Allocate this producer's slab and events and publish their handles (once).

        The slab's size is rounded up to whole 2 MiB pages: on the H200 a consumer copied
        from the slots of an imported slab a few KiB longer than whole pages (the slots'
        small arrays), in turn, about 25% slower (tools/bench_ipc_copy.py), as if the
        importer mapped all of it with small pages.
        """
        per = self.spec.slots_per_producer
        nbytes = -(-per * self.layout.slot_bytes // SLAB_PAGE) * SLAB_PAGE
        self._own_ptr = cuda.device_malloc(nbytes, self.device)
        slab = cuda.wrap_device_pointer(self._own_ptr, nbytes)
        with torch.cuda.device(self.device):
            self._own_events = [torch.cuda.Event(interprocess=True) for _ in range(per)]
            handles = [bytes(e.ipc_handle()) for e in self._own_events]
        self._own_views = [self.layout.views(slab, k) for k in range(per)]
        self._first = self.spec.producer_slots(producer).start
        index = torch.cuda.current_device() if self.device.index is None else self.device.index
        export = _Export(cuda.ipc_get_handle(self._own_ptr), nbytes, index, handles)
        row = self.control.ranks[local_index]
        encoded = msgspec.msgpack.encode(export)
        if len(encoded) > row["handles"].shape[0]:
            raise RingError(f"device handles of {len(encoded)} bytes do not fit the control block")
        put_bytes(row, "handles", encoded)

    def writer_views(self, slot: int) -> dict[str, torch.Tensor]:
        """Producer's views of `slot` (in its own slab)."""
        return self._own_views[slot - self._first]

    def after_write(self, slot: int) -> None:
        """Record the slot's interprocess event on the producer's current stream."""
        self._own_events[slot - self._first].record(torch.cuda.current_stream(self.device))

    def _import(self, producer: int) -> _Import:
        imported = self._imports.get(producer)
        if imported is None:
            local_index = self.spec.producers[producer]
            row = self.control.ranks[local_index]
            raw = get_bytes(row["handles"], row["handles_len"])
            if not raw:
                raise RingError(
                    f"producer {producer} published no device handles before its first item"
                )
            try:
                imported = _Import(msgspec.msgpack.decode(raw, type=_Export), self.device)
            except RuntimeError as exc:
                rank = self.spec.global_ranks[local_index]
                raise RingError(
                    f"cannot open the CUDA IPC slab of producer rank {rank} "
                    f"on {self.device}: {exc}. "
                    f"A process cannot open its own handle, and GPUs without peer access cannot "
                    f"share memory; set ring.transport = 'host'"
                ) from exc
            self._imports[producer] = imported
        return imported

    def reader_bytes(self, slot: int) -> torch.Tensor:
        """The raw bytes of `slot` inside its producer's slab (opened once, cached)."""
        block = self._import_bytes.get(slot)
        if block is None:
            producer, place = self.spec.slot_owner(slot)
            block = self.layout.slot_block(self._import(producer).slab, place)
            self._import_bytes[slot] = block
        return block

    def before_read(self, slot: int, stream: torch.cuda.Stream | None) -> None:
        """Make the consumer's stream wait for the producer's writes into `slot`."""
        producer, place = self.spec.slot_owner(slot)
        assert stream is not None
        stream.wait_event(self._import(producer).events[place])

    def close(self) -> None:
        """Close imported mappings and free this producer's slab."""
        self._import_bytes.clear()
        for imported in self._imports.values():
            imported.slab = None
            cuda.ipc_close(imported.ptr, self.device)
        self._imports.clear()
        self._own_views = []
        self._own_events = []
        if self._own_ptr:
            torch.cuda.synchronize(self.device)
            cuda.device_free(self._own_ptr, self.device)
            self._own_ptr = 0
