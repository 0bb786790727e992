"""A ring's spec and a slot's layout (ringtrain/ring/spec.py), without a ring: every problem
of a spec named at once, the bounds accepted, the producer groups and their names in
messages, which producer owns which slot, and where each array of a slot lies."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch

from ringtrain.ring import CONSUMER, PRODUCER, RingSpec
from ringtrain.ring.spec import MAX_SLOTS_PER_PRODUCER, SlotField, SlotLayout, dtype_name

FIELDS = (SlotField("ids", "int32", "token"), SlotField("hidden", "bfloat16", "token", 6))


def _spec(**changes: Any) -> RingSpec:
    """Two producers and two consumers on node 1 of a run (global ranks 4-7)."""
    values: dict[str, Any] = {
        "run_id": "run_1-a", "generation": 0, "ends": [PRODUCER] * 2 + [CONSUMER] * 2,
        "global_ranks": [4, 5, 6, 7], "slots_per_producer": 3, "max_tokens": 10,
        "max_docs": 2, "fields": FIELDS,
    }  # fmt: skip
    return RingSpec(**{**values, **changes})


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"run_id": "a" * 65}, "must be 1-64 characters of [A-Za-z0-9_-]"),
        ({"run_id": ""}, "run_id '' must be 1-64 characters"),
        ({"slots_per_producer": 0}, "slots_per_producer must be >= 1 (got 0)"),
        ({"max_tokens": 0}, "max_tokens must be >= 1 (got 0)"),
        ({"max_docs": 0}, "max_docs must be >= 1 (got 0)"),
        ({"slots_per_producer": MAX_SLOTS_PER_PRODUCER + 1},
         f"= {MAX_SLOTS_PER_PRODUCER + 1} is more than {MAX_SLOTS_PER_PRODUCER}; a few slots"),
        ({"heartbeat_timeout_s": 0.0}, "startup_timeout_s must be > 0"),
        ({"startup_timeout_s": -1.0}, "startup_timeout_s must be > 0"),
        ({"global_ranks": [4, 5, 6]}, "ends (4) and global_ranks (3) differ in length"),
        ({"labels": ["target"]}, "labels (1) must name every rank (4) or none"),
        ({"ends": [PRODUCER, "reader", CONSUMER, CONSUMER]}, "unknown ends ['reader']"),
        ({"ends": [PRODUCER] * 4}, "need at least one producer and one consumer"),
        ({"group_size": 3}, "group_size = 3 must be >= 1 and divide the 2 producer-end ranks"),
        ({"group_size": 0}, "group_size = 0 must be >= 1"),
        ({"fields": ()}, "fields [] must be one or more, each name once"),
        ({"fields": (FIELDS[0], FIELDS[0])}, "fields ['ids', 'ids'] must be one or more, each"),
        ({"fields": (SlotField("x", "float64", "token"),)}, "field dtypes ['float64'] are not"),
        ({"fields": (SlotField("x", "int32", "token", 0),)}, "fields ['x'] need a width >= 1"),
        ({"fields": (FIELDS[1], SlotField("cu", "int32", "document"))},
         "the last field (cu) must have one row per token"),
    ],
)  # fmt: skip
def test_each_problem_of_a_spec_is_named(changes: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValueError) as refusal:
        _spec(**changes)
    assert str(refusal.value).startswith("invalid ring spec: ")
    assert problem in str(refusal.value)


def test_every_problem_is_named_at_once_and_the_bounds_are_accepted() -> None:
    with pytest.raises(ValueError) as refusal:
        _spec(run_id="a b", max_docs=0, ends=[PRODUCER] * 4)
    assert str(refusal.value).count("; ") == 2
    _spec(run_id="a" * 64, slots_per_producer=MAX_SLOTS_PER_PRODUCER, max_tokens=1, max_docs=1)
    _spec(group_size=2, labels=["target"] * 2 + ["drafter"] * 2)


def test_producer_groups_publish_through_their_lead_and_are_named_by_place() -> None:
    grouped = _spec(ends=[PRODUCER] * 4 + [CONSUMER], global_ranks=[5, 6, 7, 8, 9],
                    group_size=2, labels=["target"] * 4 + ["drafter"])  # fmt: skip
    assert grouped.groups_local == ((0, 1), (2, 3))
    assert grouped.producers == (0, 2) and grouped.consumers == (4,)
    # Node 1 of a run of five ranks a node: its groups are 2 and 3 over the nodes.
    assert [grouped.group_of(i) for i in range(5)] == [(2, 0), (2, 1), (3, 0), (3, 1), None]
    assert grouped.describe(3) == "target, group 3 member 1"
    assert grouped.describe(4) == "drafter"
    plain = _spec()
    assert plain.producers == (0, 1) and plain.group_of(0) is None
    assert plain.describe(2) == CONSUMER  # the end, where the run named no labels


def test_each_producer_owns_its_run_of_slots() -> None:
    spec = _spec()
    assert spec.num_slots == 6
    assert [spec.slot_owner(slot) for slot in (0, 2, 3, 5)] == [(0, 0), (0, 2), (1, 0), (1, 2)]
    assert list(spec.producer_slots(1)) == [3, 4, 5]
    with pytest.raises(KeyError, match=r"the ring's slots have no field 'x': \['ids', 'hidden'\]"):
        spec.field("x")
    assert spec.field("hidden") is spec.fields[1]


def test_a_slot_lays_its_arrays_out_aligned_in_order_and_an_item_uses_a_prefix() -> None:
    cu = SlotField("cu", "int32", "document")
    spec = _spec(fields=(cu, *FIELDS), max_tokens=300, max_docs=200)
    layout = SlotLayout.of(spec)
    # cu: 201 rows x 4 bytes -> 1024; ids: 300 x 4 -> 1536; hidden: 300 x 6 x 2 = 3600 -> 4096
    assert layout.offsets == {"cu": 0, "ids": 1024, "hidden": 2560}
    assert layout.slot_bytes == 2560 + 4096
    assert layout.used_bytes(7) == 2560 + 7 * 12
    slab = torch.zeros(3 * layout.slot_bytes, dtype=torch.uint8)
    views = layout.views(slab, 2)
    assert views["hidden"].shape == (300, 6) and views["hidden"].dtype == torch.bfloat16
    assert views["cu"].shape == (201,) and views["ids"].dtype == torch.int32
    views["ids"][0] = -1
    assert slab[2 * layout.slot_bytes + 1024 :][:4].tolist() == [255] * 4
    item = layout.item_views(views, num_tokens=5, num_docs=2)
    assert {name: tuple(v.shape) for name, v in item.items()} == {
        "cu": (3,), "ids": (5,), "hidden": (5, 6),
    }  # fmt: skip


def test_a_spec_survives_its_encoding_and_dtypes_are_named() -> None:
    spec = _spec(group_size=2, labels=["t", "t", "d", "d"], transport="host")
    assert RingSpec.decode(spec.encode()) == spec
    assert dataclasses.replace(spec, generation=4).generation == 4
    assert dtype_name(torch.bfloat16) == "bfloat16"
    with pytest.raises(ValueError, match="float64 is not supported by the ring"):
        dtype_name(torch.float64)
