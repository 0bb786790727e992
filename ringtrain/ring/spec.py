"""What a ring looks like: the run-wide RingSpec and the byte layout of one payload slot.

The spec is written into the control block by the creating rank, so attaching ranks
only need the run id. `SlotLayout` places the five payload arrays of one slot
(hidden, input_ids, loss_mask, position_ids, cu_seqlens) at aligned offsets; the same
layout is used for host slots and for device slabs.
"""

from __future__ import annotations

import functools
import re
from dataclasses import asdict, dataclass

import msgspec
import torch

ROLES = ("target", "drafter")
TRANSPORTS = ("auto", "device", "host")
# More slots than this never help a producer and would make the control block huge.
MAX_SLOTS_PER_PRODUCER = 1024
RUN_ID_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# Every payload array starts on this boundary (covers any dtype and DMA alignment).
ALIGN = 512

_DTYPES: dict[str, torch.dtype] = {
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float32": torch.float32,
}


def dtype_name(dtype: torch.dtype) -> str:
    """The short name of a supported hidden-state dtype ("bfloat16", ...)."""
    for name, value in _DTYPES.items():
        if value == dtype:
            return name
    raise ValueError(
        f"hidden_dtype {dtype} is not supported by the ring: use one of {list(_DTYPES)}"
    )


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass(frozen=True)
class RingSpec:
    """Geometry, roles and limits of one node-local ring (identical in every rank)."""

    run_id: str
    generation: int
    roles: list[str]
    global_ranks: list[int]
    slots_per_producer: int
    max_tokens: int
    max_docs: int
    hidden_width: int
    hidden_dtype: torch.dtype
    transport: str = "auto"
    wait_timeout_s: float = 1.0
    heartbeat_timeout_s: float = 30.0
    progress_timeout_s: float = 45.0
    startup_timeout_s: float = 600.0
    lock_dir: str = "/dev/shm"
    # Consecutive target ranks per target group (tensor parallelism): only each group's
    # first member is a producer; the others attach for liveness and own no slots.
    target_tp: int = 1

    def __post_init__(self) -> None:
        problems = []
        if not RUN_ID_PATTERN.match(self.run_id):
            problems.append(f"run_id {self.run_id!r} must be 1-64 characters of [A-Za-z0-9_-]")
        if len(self.roles) != len(self.global_ranks):
            problems.append(
                f"roles ({len(self.roles)}) and global_ranks ({len(self.global_ranks)}) differ in length"
            )
        if bad := [r for r in self.roles if r not in ROLES]:
            problems.append(f"unknown roles {bad}: use {ROLES}")
        if "target" not in self.roles or "drafter" not in self.roles:
            problems.append(f"roles {self.roles} need at least one target and one drafter")
        targets = self.roles.count("target")
        if self.target_tp < 1 or targets % self.target_tp:
            problems.append(
                f"target_tp = {self.target_tp} must be >= 1 and divide the {targets} target ranks"
            )
        if self.transport not in TRANSPORTS:
            problems.append(f"transport {self.transport!r} must be one of {TRANSPORTS}")
        for name in ("slots_per_producer", "max_tokens", "max_docs", "hidden_width"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1 (got {getattr(self, name)})")
        if self.slots_per_producer > MAX_SLOTS_PER_PRODUCER:
            problems.append(
                f"slots_per_producer = {self.slots_per_producer} is more than "
                f"{MAX_SLOTS_PER_PRODUCER}; a few slots per target keep it busy (4 is typical)"
            )
        timeouts = ("wait", "heartbeat", "progress", "startup")
        if any(getattr(self, f"{name}_timeout_s") <= 0 for name in timeouts):
            problems.append(", ".join(f"{name}_timeout_s" for name in timeouts) + " must be > 0")
        dtype_name(self.hidden_dtype)
        if problems:
            raise ValueError("invalid ring spec: " + "; ".join(problems))

    @property
    def num_ranks(self) -> int:
        """Number of ring-local ranks (targets + drafters)."""
        return len(self.roles)

    @functools.cached_property
    def producers(self) -> tuple[int, ...]:
        """Ring-local indices of the producers, in producer order: every target rank, or
        with target groups (target_tp > 1) each group's lead."""
        return tuple(g[0] for g in self.target_groups_local)

    @functools.cached_property
    def consumers(self) -> tuple[int, ...]:
        """Ring-local indices of the drafter ranks."""
        return tuple(i for i, role in enumerate(self.roles) if role == "drafter")

    @functools.cached_property
    def target_groups_local(self) -> tuple[tuple[int, ...], ...]:
        """Ring-local indices of each target group's ranks, lead first, in producer order."""
        targets = [i for i, role in enumerate(self.roles) if role == "target"]
        k = self.target_tp
        return tuple(tuple(targets[i : i + k]) for i in range(0, len(targets), k))

    def target_group(self, index: int) -> tuple[int, int] | None:
        """(group index, global over nodes; member index) of ring-local rank `index` when
        target groups are on (target_tp > 1); None for a drafter or without groups."""
        if self.target_tp == 1:
            return None
        node = self.global_ranks[0] // self.num_ranks  # nodes have equal rank counts
        for producer, members in enumerate(self.target_groups_local):
            if index in members:
                return node * len(self.target_groups_local) + producer, members.index(index)
        return None

    def role_label(self, index: int) -> str:
        """How messages name ring-local rank `index`'s role: "target", "drafter", or with
        target groups "target, group G member M"."""
        group = self.target_group(index)
        return self.roles[index] if group is None else f"target, group {group[0]} member {group[1]}"

    @property
    def num_slots(self) -> int:
        """Slots of the whole ring."""
        return self.slots_per_producer * len(self.producers)

    def slot_owner(self, slot: int) -> tuple[int, int]:
        """(owning producer, place among that producer's slots) of ring slot `slot`."""
        return divmod(slot, self.slots_per_producer)

    def producer_slots(self, producer: int) -> range:
        """Ring slot indices owned by producer `producer`."""
        first = producer * self.slots_per_producer
        return range(first, first + self.slots_per_producer)

    def encode(self) -> bytes:
        """msgpack bytes that `decode` turns back into an equal spec."""
        fields = asdict(self)
        fields["hidden_dtype"] = dtype_name(self.hidden_dtype)
        return msgspec.msgpack.encode(fields)

    @classmethod
    def decode(cls, data: bytes) -> RingSpec:
        """Inverse of `encode`."""
        fields = msgspec.msgpack.decode(data)
        fields["hidden_dtype"] = _DTYPES[fields["hidden_dtype"]]
        return cls(**fields)


@dataclass(frozen=True)
class SlotLayout:
    """Byte offsets of the payload arrays inside one slot, and the slot's size.

    The small arrays come first and the hidden rows last, so the bytes an item uses are
    one prefix of its slot (`used_bytes`): a consumer brings an item over in one copy
    into a buffer laid out like a slot.
    """

    input_ids: int
    loss_mask: int
    position_ids: int
    cu_seqlens: int
    hidden: int
    slot_bytes: int

    @classmethod
    def of(cls, spec: RingSpec) -> SlotLayout:
        """Lay out one slot of `spec` (small arrays, then hidden; every array aligned)."""
        sizes = [
            spec.max_tokens * 4,
            spec.max_tokens,
            spec.max_tokens * 4,
            (spec.max_docs + 1) * 4,
            spec.max_tokens * spec.hidden_width * spec.hidden_dtype.itemsize,
        ]
        offsets = []
        cursor = 0
        for size in sizes:
            offsets.append(cursor)
            cursor += _align(size)
        return cls(*offsets, slot_bytes=cursor)

    def used_bytes(self, num_tokens: int, spec: RingSpec) -> int:
        """Length of the slot prefix that holds an item of `num_tokens` rows."""
        return self.hidden + num_tokens * spec.hidden_width * spec.hidden_dtype.itemsize

    def slot_block(self, slab: torch.Tensor, slot: int) -> torch.Tensor:
        """The raw bytes of slot `slot` inside `slab` (a flat uint8 tensor of whole slots)."""
        return slab[slot * self.slot_bytes : (slot + 1) * self.slot_bytes]

    def views(self, slab: torch.Tensor, slot: int, spec: RingSpec) -> dict[str, torch.Tensor]:
        """Typed views of slot `slot` inside `slab` (a flat uint8 tensor of whole slots)."""
        block = self.slot_block(slab, slot)
        n = spec.max_tokens

        def view(offset: int, count: int, dtype: torch.dtype) -> torch.Tensor:
            return block[offset : offset + count * dtype.itemsize].view(dtype)

        return {
            "hidden": view(self.hidden, n * spec.hidden_width, spec.hidden_dtype).view(
                n, spec.hidden_width
            ),
            "input_ids": view(self.input_ids, n, torch.int32),
            "loss_mask": view(self.loss_mask, n, torch.uint8),
            "position_ids": view(self.position_ids, n, torch.int32),
            "cu_seqlens": view(self.cu_seqlens, spec.max_docs + 1, torch.int32),
        }
