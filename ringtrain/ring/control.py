"""Byte layout of the control block and numpy views onto it.

The control block is one POSIX shared-memory segment:

    header | slot table [num_slots] | rank table [num_ranks] | ready FIFO int32 [num_slots]

The header carries the encoded RingSpec, so any process can rebuild the layout from the
segment alone (that is how attaching ranks and `ringtrain-stat` open it). All fields are
naturally aligned little-endian integers; a reader that maps the segment read-only sees
a consistent-enough picture for statistics without taking any lock.
"""

from __future__ import annotations

import mmap
import time

import numpy as np

from ringtrain.ring.liveness import monotonic_ns, own_identity
from ringtrain.ring.spec import CONSUMER, PRODUCER, RingSpec, SlotLayout

MAGIC = int.from_bytes(b"RINGTRN1", "little")
# 4: the spec names each rank's end (producer or consumer) and its label, not a role.
# 5: each rank's heartbeat thread records whether its main thread works (phases.py).
# 6: and whether it waits on its peers in a collective (phases.deadlock).
# 8: a slot keeps its state, owner, sequence number and descriptor only (nothing read
# the rest).
VERSION = 8
SPEC_BYTES = 4096
REASON_BYTES = 256
DESC_BYTES = 512
ERROR_BYTES = 512
# What a rank announced it is doing, in words (phases.py).
DOING_BYTES = 96
# Where a rank's main thread was when its heartbeat thread last sampled it.
WHERE_BYTES = 160
# Device transport: room per exported handle (64 B each: the slab, one event per slot)
# including msgpack framing.
HANDLE_BYTES = 80

# Slot states.
FREE, WRITING, READY, READING = 0, 1, 2, 3
SLOT_STATES = ("free", "writing", "ready", "reading")
# Rank status.
EMPTY, ATTACHED, FINISHED, CLOSED, FAILED = 0, 1, 2, 3, 4
RANK_STATUS = ("empty", "attached", "finished", "closed", "failed")
# Which end of the ring a rank sits at (the rank table's `end`).
END_CODES = {PRODUCER: 0, CONSUMER: 1}

HEADER = np.dtype(
    [
        ("magic", "<u8"),
        ("version", "<i4"),
        ("num_ranks", "<i4"),
        ("num_slots", "<i4"),
        ("transport", "<i4"),
        ("generation", "<i8"),
        ("slot_bytes", "<i8"),
        ("created_wall_ns", "<i8"),
        ("created_mono_ns", "<i8"),
        ("creator_pid", "<i8"),
        ("creator_start", "<i8"),
        ("closing", "<i4"),
        ("closing_rank", "<i4"),
        ("fifo_head", "<u8"),
        ("fifo_tail", "<u8"),
        ("reason_len", "<i4"),
        ("spec_len", "<i4"),
        ("reason", "u1", (REASON_BYTES,)),
        ("spec", "u1", (SPEC_BYTES,)),
    ],
    align=True,
)

SLOT = np.dtype(
    [
        ("state", "<i4"),
        ("owner", "<i4"),
        ("desc_len", "<i4"),
        ("seq", "<i8"),
        ("desc", "u1", (DESC_BYTES,)),
    ],
    align=True,
)


def rank_dtype(slots_per_producer: int) -> np.dtype:
    """Rank-table entry; its handle field fits one slab handle and one event per slot."""
    return np.dtype(
        [
            ("end", "<i4"),
            ("status", "<i4"),
            ("global_rank", "<i4"),
            ("device", "<i4"),
            ("pid", "<i8"),
            ("start_time", "<i8"),
            ("attached_ns", "<i8"),
            ("heartbeat_ns", "<i8"),
            ("step", "<i8"),
            # Last progress of the rank's main thread, and the phase it announced
            # (written by that thread only; see phases.py).
            ("progress_ns", "<i8"),
            # Written by the rank's heartbeat thread, which samples the main thread: the
            # last time it saw it working (stack moving, CPU in use, waiting on peers),
            # and since when its stack has not moved (phases.py).
            ("active_ns", "<i8"),
            ("still_ns", "<i8"),
            ("items", "<i8"),
            ("blocked_ns", "<i8"),
            ("starved_ns", "<i8"),
            # Start of the wait in progress (0 when not waiting), so live waits show up.
            ("wait_start_ns", "<i8"),
            # The main thread's wait on its peers in a collective, as last sampled: since
            # when (0 when not in one), how many it completed, the group's size.
            ("peer_wait_ns", "<i8"),
            ("peer_waits_done", "<i8"),
            # This rank's GPU busy fraction as it last sampled it; negative: unknown.
            ("gpu_busy", "<f8"),
            ("phase", "<i4"),
            ("error_len", "<i4"),
            ("handles_len", "<i4"),
            ("doing_len", "<i4"),
            ("cpu_busy", "<i4"),  # the last sample saw the main thread use the CPU
            ("where_len", "<i4"),
            ("peer_group", "<i4"),
            ("in_torch", "<i4"),  # the last sample saw the main thread in torch's code
            ("error", "u1", (ERROR_BYTES,)),
            ("doing", "u1", (DOING_BYTES,)),
            ("where", "u1", (WHERE_BYTES,)),
            ("handles", "u1", (HANDLE_BYTES * (slots_per_producer + 2),)),
        ],
        align=True,
    )


def header_problem(buffer: bytes | mmap.mmap) -> str | None:
    """Why `buffer` does not start with a ring control block of this layout (None if it
    does): too short, or without the magic number and version a creator writes."""
    if len(buffer) < HEADER.itemsize:
        return f"{len(buffer)} bytes is too small for a ring control block"
    header = np.ndarray((), dtype=HEADER, buffer=buffer, offset=0)
    magic, version = int(header["magic"]), int(header["version"])
    del header
    if magic != MAGIC or version != VERSION:
        return (
            f"not a ringtrain control block of layout version {VERSION} "
            f"(magic {magic:#x}, version {version})"
        )
    return None


def read_header(path: str) -> bytes:
    """The first bytes of a control segment, as many as a header has (fewer if shorter)."""
    with open(path, "rb") as segment:
        return segment.read(HEADER.itemsize)


def _round64(n: int) -> int:
    return (n + 63) // 64 * 64


class ControlLayout:
    """Offsets of the tables of one ring's control block."""

    def __init__(self, spec: RingSpec) -> None:
        self.rank = rank_dtype(spec.slots_per_producer)
        self.slots_offset = _round64(HEADER.itemsize)
        self.ranks_offset = _round64(self.slots_offset + SLOT.itemsize * spec.num_slots)
        self.fifo_offset = _round64(self.ranks_offset + self.rank.itemsize * spec.num_ranks)
        self.total_bytes = _round64(self.fifo_offset + 4 * spec.num_slots)


def put_bytes(record: np.ndarray | np.void, name: str, data: bytes) -> None:
    """Store `data` (truncated to fit) in the byte field `name` of `record`, length in
    `name_len`."""
    field = record[name]
    data = data[: field.shape[-1]]
    field[: len(data)] = np.frombuffer(data, dtype=np.uint8)
    record[f"{name}_len"] = len(data)


def get_bytes(field: np.ndarray, length: int) -> bytes:
    """Read back what `put_bytes` stored."""
    return field[: int(length)].tobytes()


class ControlBlock:
    """Numpy views onto a mapped control block (writable or read-only)."""

    def __init__(self, buffer: mmap.mmap, spec: RingSpec) -> None:
        self.spec = spec
        layout = ControlLayout(spec)
        self.header = np.ndarray((), dtype=HEADER, buffer=buffer, offset=0)
        self.slots = np.ndarray(
            (spec.num_slots,), dtype=SLOT, buffer=buffer, offset=layout.slots_offset
        )
        self.ranks = np.ndarray(
            (spec.num_ranks,), dtype=layout.rank, buffer=buffer, offset=layout.ranks_offset
        )
        self.fifo = np.ndarray(
            (spec.num_slots,), dtype="<i4", buffer=buffer, offset=layout.fifo_offset
        )
        # Per-field column views, so hot paths index plain integer arrays.
        self.slot = {name: self.slots[name] for name in SLOT.names}
        self.rank = {name: self.ranks[name] for name in layout.rank.names}
        self.slot_state = self.slot["state"]
        self.fifo_head = self.header["fifo_head"]
        self.fifo_tail = self.header["fifo_tail"]
        self.closing = self.header["closing"]
        self._buffer = buffer
        self._desc_offset = layout.slots_offset + SLOT.fields["desc"][1]

    @staticmethod
    def read_spec(buffer: mmap.mmap, where: str) -> RingSpec:
        """Decode the spec stored in a control block's header; `where` names the segment."""
        if (problem := header_problem(buffer)) is not None:
            raise ValueError(f"{where}: {problem}")
        header = np.ndarray((), dtype=HEADER, buffer=buffer, offset=0)
        return RingSpec.decode(get_bytes(header["spec"], header["spec_len"]))

    def write_desc(self, slot: int, data: bytes) -> None:
        """Store a slot's encoded descriptor (raises ValueError if it does not fit)."""
        if len(data) > DESC_BYTES:
            raise ValueError(f"descriptor of {len(data)} bytes exceeds {DESC_BYTES}")
        start = self._desc_offset + slot * SLOT.itemsize
        self._buffer[start : start + len(data)] = data
        self.slot["desc_len"][slot] = len(data)

    def read_desc(self, slot: int) -> bytes:
        """The encoded descriptor of `slot`."""
        start = self._desc_offset + slot * SLOT.itemsize
        return self._buffer[start : start + int(self.slot["desc_len"][slot])]

    def drop(self) -> None:
        """Release every view so the mapping can be closed."""
        for name in ("header", "slots", "ranks", "fifo", "slot", "rank", "slot_state"):
            setattr(self, name, None)
        for name in ("fifo_head", "fifo_tail", "closing", "_buffer"):
            setattr(self, name, None)


def init_control(
    mm: mmap.mmap, spec: RingSpec, transport_code: int, reason: str, encoded_spec: bytes
) -> None:
    """Fill a fresh control block (creating rank only); the magic number goes last."""
    ctl = ControlBlock(mm, spec)
    h = ctl.header
    h["creator_pid"], h["creator_start"] = own_identity()
    h["version"] = VERSION
    h["num_ranks"], h["num_slots"] = spec.num_ranks, spec.num_slots
    h["transport"] = transport_code
    h["generation"] = spec.generation
    h["slot_bytes"] = SlotLayout.of(spec).slot_bytes
    h["created_wall_ns"] = time.time_ns()
    h["created_mono_ns"] = monotonic_ns()
    h["closing_rank"] = -1
    put_bytes(h, "reason", reason.encode())
    put_bytes(h, "spec", encoded_spec)
    ctl.slots["owner"] = [spec.slot_owner(g)[0] for g in range(spec.num_slots)]
    ctl.slots["seq"] = -1
    ctl.ranks["end"] = [END_CODES[e] for e in spec.ends]
    ctl.ranks["global_rank"] = spec.global_ranks
    ctl.ranks["device"] = -1
    h["magic"] = MAGIC
    ctl.drop()
