"""The host transport's slots in one shared /dev/shm segment: its size, permissions and
prefaulted pages, each slot's views at its own place (written in one process, read in
another), and what a payload leaves behind: no descriptor, no mapping once its views go."""

from __future__ import annotations

import contextlib
import mmap
import multiprocessing as mp
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import posix_ipc
import pytest
import torch

from ringtrain.batch import slot_fields
from ringtrain.ring import CONSUMER, PRODUCER, RingSpec
from ringtrain.ring.control import ControlBlock, ControlLayout
from ringtrain.ring.host_payload import HostPayload
from ringtrain.ring.names import data_name
from ringtrain.ring.spec import SlotLayout
from tests.helpers.host_payload_writer import stamp, write_every_slot

CTX = mp.get_context("spawn")
JOIN_S = 120


@pytest.fixture
def spec() -> Iterator[RingSpec]:
    """A ring of one producer with three slots of 64 tokens (about 18 KiB each): none of
    its objects exist yet, and the test's segment is removed after it."""
    spec = RingSpec(
        run_id=f"hp{uuid.uuid4().hex[:10]}", generation=0, ends=[PRODUCER, CONSUMER],
        global_ranks=[0, 1], slots_per_producer=3, max_tokens=64, max_docs=4,
        fields=slot_fields(2, 32, "float32"), transport="host",
    )  # fmt: skip
    yield spec
    with contextlib.suppress(posix_ipc.ExistentialError):
        posix_ipc.unlink_shared_memory(data_name(spec.run_id))
    assert not [e for e in os.listdir("/dev/shm") if spec.run_id in e]


def segment(spec: RingSpec) -> Path:
    return Path("/dev/shm") / data_name(spec.run_id).lstrip("/")


def open_payload(spec: RingSpec) -> tuple[HostPayload, ControlBlock]:
    """A CPU rank's payload (and the control block it is opened with, in anonymous memory)."""
    control = ControlBlock(mmap.mmap(-1, ControlLayout(spec).total_bytes), spec)
    return HostPayload(spec, SlotLayout.of(spec), torch.device("cpu"), control), control


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def mapped(spec: RingSpec) -> bool:
    """Whether this process maps the run's payload segment."""
    return segment(spec).name in Path("/proc/self/maps").read_text()


def test_the_segment_holds_every_slot_for_its_owner_only_with_its_pages_allocated(
    spec: RingSpec,
) -> None:
    layout = SlotLayout.of(spec)
    HostPayload.create(spec, layout)
    info = segment(spec).stat()
    assert HostPayload.shm_bytes(spec, layout) == info.st_size == 3 * layout.slot_bytes
    assert info.st_mode & 0o777 == 0o600
    # Prefaulted: /dev/shm's pages are taken now (a full /dev/shm fails here, not as SIGBUS).
    assert info.st_size > 4 * mmap.PAGESIZE and info.st_blocks * 512 >= info.st_size
    with pytest.raises(posix_ipc.ExistentialError):
        HostPayload.create(spec, layout)  # a leftover of the same name is never taken over


def test_slots_written_in_one_process_are_read_in_another(spec: RingSpec) -> None:
    """A spawned producer stamps every field of every slot through its views; this
    process's reader bytes of each slot hold that slot's stamps at the layout's offsets,
    as the segment's own bytes do."""
    layout = SlotLayout.of(spec)
    HostPayload.create(spec, layout)
    writer = CTX.Process(target=write_every_slot, args=(spec,))
    writer.start()
    writer.join(JOIN_S)
    assert writer.exitcode == 0
    payload, control = open_payload(spec)
    try:
        raw = np.fromfile(segment(spec), dtype=np.uint8)
        for slot in range(spec.num_slots):
            block = payload.reader_bytes(slot)
            assert block.numel() == layout.slot_bytes
            assert np.array_equal(block.numpy(), raw[slot * layout.slot_bytes :][: block.numel()])
            views = layout.views(block, 0)
            for i, field in enumerate(spec.fields):
                assert bool((views[field.name] == stamp(slot, i)).all()), (slot, field.name)
    finally:
        payload.close()
        control.drop()


def test_a_closed_payload_leaves_no_descriptor_and_no_mapping(spec: RingSpec) -> None:
    before = open_descriptors()
    HostPayload.create(spec, SlotLayout.of(spec))
    payload, control = open_payload(spec)
    assert mapped(spec)
    payload.writer_views(spec.num_slots - 1)["hidden"].fill_(1.0)  # the last slot is there
    payload.close()
    control.drop()
    assert not mapped(spec) and open_descriptors() == before


def test_views_a_producer_still_holds_stay_mapped_after_close(spec: RingSpec) -> None:
    """close() does not unmap under views another part of the rank still holds: they read
    what was written until they go, and the mapping with them."""
    HostPayload.create(spec, SlotLayout.of(spec))
    payload, control = open_payload(spec)
    hidden = payload.writer_views(1)["hidden"]
    hidden.fill_(7.0)
    payload.close()
    control.drop()
    assert mapped(spec) and bool((hidden == 7.0).all())
    del hidden
    assert not mapped(spec)
