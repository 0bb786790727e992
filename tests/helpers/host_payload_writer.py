"""A process body for the host payload tests (spawned with multiprocessing; importable by
name): a producer that opens the run's shared segment, stamps every slot and leaves."""

from __future__ import annotations

import mmap

import torch

from ringtrain.ring.control import ControlBlock, ControlLayout
from ringtrain.ring.host_payload import HostPayload
from ringtrain.ring.spec import RingSpec, SlotLayout


def stamp(slot: int, field_index: int) -> float:
    """The value the writer puts in every element of field `field_index` of `slot`."""
    return 100.0 * slot + field_index + 1


def write_every_slot(spec: RingSpec) -> None:
    """Fill each field of each slot with its stamp through the producer's views, then close."""
    control = ControlBlock(mmap.mmap(-1, ControlLayout(spec).total_bytes), spec)
    payload = HostPayload(spec, SlotLayout.of(spec), torch.device("cpu"), control)
    for slot in range(spec.num_slots):
        views = payload.writer_views(slot)
        for i, field in enumerate(spec.fields):
            views[field.name].fill_(stamp(slot, i))
        payload.after_write(slot)
    payload.close()
    control.drop()
