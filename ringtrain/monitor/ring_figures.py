"""The ring's per-rank counters as a step record carries them, and rates between two readings.

A step record's `ring` entry holds the ring's occupancy at that moment and, per rank, the
cumulative counters of the ring's control block: items moved, seconds attached, seconds
spent waiting (a target blocked on a full ring, a drafter starved on an empty one).
Differences between two readings give each rank's rate and wait share over the interval,
and its rate while not waiting, which is what the role-split advice needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ringtrain.ring import PRODUCER, RankSnapshot, RingSnapshot


@dataclass(frozen=True)
class RankFigures:
    """One rank's cumulative ring counters at one moment."""

    rank: int
    role: str  # "target" | "drafter"
    device: int  # CUDA device index; -1 on CPU
    items: int  # items produced (target) or consumed (drafter)
    up_s: float  # seconds since the rank attached to the ring
    waited_s: float  # seconds blocked on a full ring (target) or starved (drafter)

    @classmethod
    def from_snapshot(cls, rank: RankSnapshot) -> RankFigures:
        """A rank's counters; its role is the label the trainer gave its ring rank."""
        waited_ns = rank.blocked_ns if rank.end == PRODUCER else rank.starved_ns
        return cls(rank.rank, rank.label, rank.device, rank.items, rank.uptime_s, waited_ns / 1e9)


@dataclass(frozen=True)
class RankInterval:
    """One rank's figures between two readings."""

    rank: int
    role: str
    device: int
    items: int
    seconds: float
    waited_s: float

    @property
    def items_per_s(self) -> float:
        return self.items / self.seconds if self.seconds > 0 else 0.0

    @property
    def wait_share(self) -> float:
        """Share of the interval spent waiting on the other side (0..1)."""
        return min(max(self.waited_s / self.seconds, 0.0), 1.0) if self.seconds > 0 else 0.0

    @property
    def working_s(self) -> float:
        return max(self.seconds - self.waited_s, 0.0)

    @property
    def items_per_working_s(self) -> float | None:
        """Rate while not waiting (None when the rank did nothing but wait)."""
        return self.items / self.working_s if self.working_s > 0 and self.items else None


def ring_figures(snapshot: RingSnapshot) -> dict[str, Any]:
    """The `ring` entry of a step record (JSON-able)."""
    return {
        "occupancy": snapshot.occupancy,
        "ranks": [
            [f.rank, f.role, f.device, f.items, round(f.up_s, 4), round(f.waited_s, 4)]
            for f in map(RankFigures.from_snapshot, snapshot.ranks)
        ],
    }


def figures_of_record(record: dict[str, Any]) -> list[RankFigures] | None:
    """The per-rank counters a step record carries, or None if it has none."""
    ring = record.get("ring")
    if not isinstance(ring, dict) or not ring.get("ranks"):
        return None
    return [
        RankFigures(int(rank), str(role), int(device), int(items), float(up), float(waited))
        for rank, role, device, items, up, waited in ring["ranks"]
    ]


def intervals(before: list[RankFigures], after: list[RankFigures]) -> list[RankInterval]:
    """Each rank's items, seconds and waits between two readings (ranks present in both)."""
    earlier = {f.rank: f for f in before}
    result = []
    for now in after:
        then = earlier.get(now.rank)
        if then is None or now.up_s < then.up_s:  # absent before, or a restarted ring
            continue
        result.append(
            RankInterval(
                now.rank,
                now.role,
                now.device,
                now.items - then.items,
                now.up_s - then.up_s,
                now.waited_s - then.waited_s,
            )
        )
    return result


def since_attach(figures: list[RankFigures]) -> list[RankInterval]:
    """Each rank's figures over its whole time on the ring."""
    return [RankInterval(f.rank, f.role, f.device, f.items, f.up_s, f.waited_s) for f in figures]


def snapshot_intervals(
    current: RingSnapshot, previous: RingSnapshot | None = None
) -> list[RankInterval]:
    """Each rank's figures since `previous`, or since it attached when there is none."""
    now = [RankFigures.from_snapshot(r) for r in current.ranks]
    if previous is None:
        return since_attach(now)
    return intervals([RankFigures.from_snapshot(r) for r in previous.ranks], now)


def role_mean(ranks: list[RankInterval], role: str, value: str) -> float | None:
    """Mean of attribute `value` over the ranks of `role` that have one (None: none has)."""
    values = [getattr(r, value) for r in ranks if r.role == role]
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None
