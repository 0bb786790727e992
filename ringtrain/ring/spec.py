"""What a ring looks like: the run-wide RingSpec and the byte layout of one payload slot.

The spec is written into the control block by the creating rank, so attaching ranks
only need the run id. A slot holds the arrays its `fields` declare (SlotField: a name,
a dtype, one row per token or per document boundary, values per row); the ring gives
them no meaning. `SlotLayout` places them at aligned offsets in the given order; the
same layout is used for host slots and for device slabs.
"""

from __future__ import annotations

import functools
import re
from dataclasses import asdict, dataclass
from typing import Any, Literal

import msgspec
import torch

ROLES = ("target", "drafter")
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
    """Geometry, roles and limits of one node-local ring (identical in every rank)."""

    run_id: str
    generation: int
    roles: list[str]
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
    # Consecutive target ranks per target group (tensor parallelism): only each group's
    # first member is a producer; the others attach for liveness and own no slots.
    target_tp: int = 1

    def __post_init__(self) -> None:
        fields = msgspec.convert(self.fields, tuple[SlotField, ...], from_attributes=True)
        object.__setattr__(self, "fields", fields)
        problems = self._field_problems()
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
        for name in ("slots_per_producer", "max_tokens", "max_docs"):
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
        if problems:
            raise ValueError("invalid ring spec: " + "; ".join(problems))

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
