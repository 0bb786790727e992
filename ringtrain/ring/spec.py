"""What a ring looks like: the run-wide RingSpec and the byte layout of one payload slot.

The spec is written into the control block by the creating rank, so attaching ranks
only need the run id. Each rank sits at one end of the ring, producer or consumer; what
the ranks are to the run that made the ring (its labels) the ring only repeats in messages. A slot
holds the arrays its `fields` declare (SlotField: a name, a dtype, one row per token or per document
boundary, values per row); the ring gives them no meaning. `SlotLayout` places them at aligned
offsets in the given order; the same layout is used for host slots and for device slabs.
"""

from __future__ import annotations

import functools
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import msgspec
import torch

# The two ends of the ring: producers publish items into their own slots, consumers take them.
PRODUCER, CONSUMER = "producer", "consumer"
ENDS = (PRODUCER, CONSUMER)
# More slots than this never help a producer and would make the control block huge.
MAX_SLOTS_PER_PRODUCER = 1024
RUN_ID_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# Every payload array starts on this boundary (covers any dtype and DMA alignment).
ALIGN = 512

_DTYPES: dict[str, torch.dtype] = {
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float32": torch.float32,
    "int32": torch.int32,
    "int64": torch.int64,
    "uint8": torch.uint8,
}


def dtype_name(dtype: torch.dtype) -> str:
    """The short name of a dtype a slot can hold ("bfloat16", "int32", ...)."""
    for name, value in _DTYPES.items():
        if value == dtype:
            return name
    raise ValueError(f"dtype {dtype} is not supported by the ring: use one of {list(_DTYPES)}")


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class SlotField(msgspec.Struct, frozen=True, array_like=True):
    """One array of a slot: rows of `width` values of `dtype`, one row per token
    (max_tokens rows) or per document boundary (max_docs + 1 rows)."""

    name: str
    dtype: str
    per: Literal["token", "document"]
    width: int = 1

    @property
    def torch_dtype(self) -> torch.dtype:
        """The field's dtype as torch spells it."""
        return _DTYPES[self.dtype]

    def rows(self, num_tokens: int, num_docs: int) -> int:
        """Rows this field takes for `num_tokens` tokens in `num_docs` documents."""
        return num_tokens if self.per == "token" else num_docs + 1

    def row_bytes(self) -> int:
        """Bytes of one row."""
        return self.width * self.torch_dtype.itemsize


@dataclass(frozen=True)
class RingSpec:
    """Geometry, ends and limits of one node-local ring (identical in every rank)."""

    run_id: str
    generation: int
    # The end of the ring each ring-local rank sits at: PRODUCER or CONSUMER.
    ends: list[str]
    global_ranks: list[int]
    slots_per_producer: int
    max_tokens: int
    max_docs: int
    # The arrays of a slot, in slot order (anything with SlotField's attributes).
    fields: tuple[SlotField, ...]
    transport: str = "auto"  # a name of payload.TRANSPORTS, or "auto"
    wait_timeout_s: float = 1.0
    heartbeat_timeout_s: float = 30.0
    progress_timeout_s: float = 45.0
    startup_timeout_s: float = 600.0
    lock_dir: str = "/dev/shm"
    # Consecutive producer-end ranks per producer group: only each group's first member
    # (its lead) publishes; the others attach for liveness and own no slots.
    group_size: int = 1
    # What the run calls each rank, for messages and ringtrain-stat (default: its end).
    labels: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        fields = msgspec.convert(self.fields, tuple[SlotField, ...], from_attributes=True)
        object.__setattr__(self, "fields", fields)
        problems = self._field_problems() + self._end_problems()
        if not RUN_ID_PATTERN.match(self.run_id):
            problems.append(f"run_id {self.run_id!r} must be 1-64 characters of [A-Za-z0-9_-]")
        for name in ("slots_per_producer", "max_tokens", "max_docs"):
            if getattr(self, name) < 1:
                problems.append(f"{name} must be >= 1 (got {getattr(self, name)})")
        if self.slots_per_producer > MAX_SLOTS_PER_PRODUCER:
            problems.append(
                f"slots_per_producer = {self.slots_per_producer} is more than "
                f"{MAX_SLOTS_PER_PRODUCER}; a few slots per producer keep it busy (4 is typical)"
            )
        timeouts = ("wait", "heartbeat", "progress", "startup")
        if any(getattr(self, f"{name}_timeout_s") <= 0 for name in timeouts):
            problems.append(", ".join(f"{name}_timeout_s" for name in timeouts) + " must be > 0")
        if problems:
            raise ValueError("invalid ring spec: " + "; ".join(problems))

    def _end_problems(self) -> list[str]:
        """What is wrong with `ends`, `global_ranks`, `labels` and `group_size` together."""
        problems = []
        if len(self.ends) != len(self.global_ranks):
            problems.append(
                f"ends ({len(self.ends)}) and global_ranks ({len(self.global_ranks)}) "
                "differ in length"
            )
        if self.labels and len(self.labels) != len(self.ends):
            problems.append(
                f"labels ({len(self.labels)}) must name every rank ({len(self.ends)}) or none"
            )
        if bad := [e for e in self.ends if e not in ENDS]:
            problems.append(f"unknown ends {bad}: use {ENDS}")
        if PRODUCER not in self.ends or CONSUMER not in self.ends:
            problems.append(f"ends {self.ends} need at least one producer and one consumer")
        producers = self.ends.count(PRODUCER)
        if self.group_size < 1 or producers % self.group_size:
            problems.append(
                f"group_size = {self.group_size} must be >= 1 and divide the {producers} "
                "producer-end ranks"
            )
        return problems

    def _field_problems(self) -> list[str]:
        """What is wrong with `fields` (see SlotLayout for why the last is per token)."""
        problems = []
        names = [f.name for f in self.fields]
        if not names or len(set(names)) != len(names):
            problems.append(f"fields {names} must be one or more, each name once")
        if bad := [f.dtype for f in self.fields if f.dtype not in _DTYPES]:
            problems.append(f"field dtypes {bad} are not supported: use {list(_DTYPES)}")
        if bad := [f.name for f in self.fields if f.width < 1]:
            problems.append(f"fields {bad} need a width >= 1")
        if self.fields and self.fields[-1].per != "token":
            problems.append(f"the last field ({names[-1]}) must have one row per token")
        return problems

    def field(self, name: str) -> SlotField:
        """The field called `name`."""
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(f"the ring's slots have no field {name!r}: {[f.name for f in self.fields]}")

    @property
    def num_ranks(self) -> int:
        """Number of ring-local ranks (both ends)."""
        return len(self.ends)

    @functools.cached_property
    def producers(self) -> tuple[int, ...]:
        """Ring-local indices of the producers, in producer order: every producer-end rank,
        or with producer groups (group_size > 1) each group's lead."""
        return tuple(g[0] for g in self.groups_local)

    @functools.cached_property
    def consumers(self) -> tuple[int, ...]:
        """Ring-local indices of the consumer-end ranks."""
        return tuple(i for i, end in enumerate(self.ends) if end == CONSUMER)

    @functools.cached_property
    def groups_local(self) -> tuple[tuple[int, ...], ...]:
        """Ring-local indices of each producer group's ranks, lead first, in producer order."""
        producers = [i for i, end in enumerate(self.ends) if end == PRODUCER]
        k = self.group_size
        return tuple(tuple(producers[i : i + k]) for i in range(0, len(producers), k))

    def group_of(self, index: int) -> tuple[int, int] | None:
        """(group index, global over nodes; member index) of ring-local rank `index` when
        producer groups are on (group_size > 1); None for a consumer or without groups."""
        if self.group_size == 1:
            return None
        node = self.global_ranks[0] // self.num_ranks  # nodes have equal rank counts
        for producer, members in enumerate(self.groups_local):
            if index in members:
                return node * len(self.groups_local) + producer, members.index(index)
        return None

    def label(self, index: int) -> str:
        """What the run calls ring-local rank `index` (its end when the run named none)."""
        return self.labels[index] if self.labels else self.ends[index]

    def describe(self, index: int) -> str:
        """How messages name ring-local rank `index`: its label, and with producer groups
        its place: "<label>, group G member M"."""
        group = self.group_of(index)
        label = self.label(index)
        return label if group is None else f"{label}, group {group[0]} member {group[1]}"

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
        values = asdict(self)
        values["fields"] = self.fields  # asdict made dicts of them; msgpack takes them as is
        return msgspec.msgpack.encode(values)

    @classmethod
    def decode(cls, data: bytes) -> RingSpec:
        """Inverse of `encode`."""
        values: dict[str, Any] = msgspec.msgpack.decode(data)
        values["fields"] = msgspec.convert(values["fields"], tuple[SlotField, ...])
        return cls(**values)


@dataclass(frozen=True)
class SlotLayout:
    """Byte offsets of the arrays inside one slot, and the slot's size.

    The fields lie in spec order and the last one has a row per token, so the bytes an
    item uses are one prefix of its slot (`used_bytes`): a consumer brings an item over in
    one copy into a buffer laid out like a slot. Put the small arrays first and the big
    one last.
    """

    spec: RingSpec
    offsets: dict[str, int]
    slot_bytes: int

    @classmethod
    def of(cls, spec: RingSpec) -> SlotLayout:
        """Lay out one slot of `spec` (fields in order, every array aligned)."""
        offsets, cursor = {}, 0
        for f in spec.fields:
            offsets[f.name] = cursor
            cursor += _align(f.rows(spec.max_tokens, spec.max_docs) * f.row_bytes())
        return cls(spec, offsets, slot_bytes=cursor)

    def used_bytes(self, num_tokens: int) -> int:
        """Length of the slot prefix that holds an item of `num_tokens` rows."""
        last = self.spec.fields[-1]
        return self.offsets[last.name] + num_tokens * last.row_bytes()

    def slot_block(self, slab: torch.Tensor, slot: int) -> torch.Tensor:
        """The raw bytes of slot `slot` inside `slab` (a flat uint8 tensor of whole slots)."""
        return slab[slot * self.slot_bytes : (slot + 1) * self.slot_bytes]

    def views(self, slab: torch.Tensor, slot: int) -> dict[str, torch.Tensor]:
        """Typed views of slot `slot` inside `slab` (a flat uint8 tensor of whole slots), by
        field name: [rows] for fields one value wide, else [rows, width]."""
        block = self.slot_block(slab, slot)
        spec, views = self.spec, {}
        for f in spec.fields:
            rows, offset = f.rows(spec.max_tokens, spec.max_docs), self.offsets[f.name]
            view = block[offset : offset + rows * f.row_bytes()].view(f.torch_dtype)
            views[f.name] = view.view(rows, f.width) if f.width > 1 else view
        return views

    def item_views(
        self, views: dict[str, torch.Tensor], num_tokens: int, num_docs: int
    ) -> dict[str, torch.Tensor]:
        """The rows of `views` (a slot's views) that an item of this size uses."""
        return {f.name: views[f.name][: f.rows(num_tokens, num_docs)] for f in self.spec.fields}
