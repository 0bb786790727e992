"""The host transport: every slot in one shared /dev/shm segment.

Producers write into the segment (on CUDA ranks pinned with cudaHostRegister, so the
device-to-host copies are asynchronous) and synchronise before publishing; consumers
copy a slot's used prefix out of it. See payload.py for the operations.
"""

from __future__ import annotations

import mmap
from typing import ClassVar

import numpy as np
import posix_ipc
import torch

from ringtrain.ring import cuda
from ringtrain.ring.control import ControlBlock
from ringtrain.ring.names import data_name
from ringtrain.ring.spec import RingSpec, SlotLayout

PAGE = mmap.PAGESIZE


class HostPayload:
    """Slots in the shared /dev/shm segment, pinned with cudaHostRegister on CUDA ranks."""

    # The producers' writes are synchronised before publishing; the segment outlives them.
    frees_slots_on_close: ClassVar[bool] = False

    @staticmethod
    def shm_bytes(spec: RingSpec, layout: SlotLayout) -> int:
        """Every slot lives in /dev/shm."""
        return spec.num_slots * layout.slot_bytes

    @staticmethod
    def create(spec: RingSpec, layout: SlotLayout) -> None:
        """Create and prefault the host payload segment (creating rank only)."""
        nbytes = spec.num_slots * layout.slot_bytes
        shm = posix_ipc.SharedMemory(
            data_name(spec.run_id), posix_ipc.O_CREX, mode=0o600, size=nbytes
        )
        try:
            with mmap.mmap(shm.fd, nbytes) as mm:
                # Touch every page now, so tmpfs over-commit fails here, not as SIGBUS later.
                np.frombuffer(mm, dtype=np.uint8)[::PAGE] = 0
        finally:
            shm.close_fd()

    def __init__(
        self, spec: RingSpec, layout: SlotLayout, device: torch.device, control: ControlBlock
    ) -> None:
        self.spec, self.layout, self.device = spec, layout, device
        shm = posix_ipc.SharedMemory(data_name(spec.run_id))
        try:
            self._mm = mmap.mmap(shm.fd, shm.size)
        finally:
            shm.close_fd()
        self._base = torch.frombuffer(self._mm, dtype=torch.uint8)
        self._registered = device.type == "cuda"
        if self._registered:
            cuda.host_register(self._base.data_ptr(), self._base.numel())
        self._views = [layout.views(self._base, s) for s in range(spec.num_slots)]
        self._reader_bytes = [layout.slot_block(self._base, s) for s in range(spec.num_slots)]

    def open_producer(self, local_index: int, producer: int) -> None:
        """Nothing to set up: the producer's slots are in the shared segment already."""

    def writer_views(self, slot: int) -> dict[str, torch.Tensor]:
        """Producer's views of `slot`."""
        return self._views[slot]

    def after_write(self, slot: int) -> None:
        """Wait for the producer's device->host copies into the slot."""
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()

    def reader_bytes(self, slot: int) -> torch.Tensor:
        """The raw bytes of `slot`, which a consumer copies a prefix of."""
        return self._reader_bytes[slot]

    def before_read(self, slot: int, stream: torch.cuda.Stream | None) -> None:
        """Nothing to wait for: the producer synchronised before publishing."""

    def close(self) -> None:
        """Unregister and let go of the mapping. It is not closed here: torch.frombuffer's
        tensors hold the mapping object but no buffer export, so closing it would unmap the
        memory under views a producer still holds (reading one then crashes the process).
        The mapping is unmapped when its last view is dropped, at once when none is left."""
        if self._registered:
            cuda.host_unregister(self._base.data_ptr())
            self._registered = False
        self._views = []
        self._reader_bytes = []
        self._base = None
        self._mm = None
