"""Ring snapshots with chosen counters, for the tests of the verdict and ringtrain-stat."""

from __future__ import annotations

from ringtrain.ring import CONSUMER, PRODUCER, RankSnapshot, RingSnapshot

S = 1_000_000_000  # ns


def rank(rank: int, role: str, items: int, up_s: float, waited_s: float) -> RankSnapshot:
    """A live rank of `role` ("target" or "drafter") on GPU `rank` that moved `items` in
    `up_s` seconds, waiting `waited_s` of them on the other end."""
    waited = int(waited_s * S)
    return RankSnapshot(
        rank=rank,
        index=rank,
        end=PRODUCER if role == "target" else CONSUMER,
        label=role,
        pid=1000 + rank,
        device=rank,
        status="attached",
        alive=True,
        dead_reason=None,
        heartbeat_age_s=0.1,
        uptime_s=up_s,
        step=0,
        items=items,
        items_per_s=items / up_s,
        blocked_pct=0.0,
        starved_pct=0.0,
        blocked_ns=waited if role == "target" else 0,
        starved_ns=waited if role == "drafter" else 0,
        last_error="",
        gpu_busy=None,
    )


def snapshot(
    ranks: list[RankSnapshot], interval_s: float | None = None, taken_s: float = 0.0
) -> RingSnapshot:
    """A full ring of 8 slots holding `ranks`, taken at `taken_s` on the monotonic clock."""
    return RingSnapshot(
        run="t",
        generation=0,
        transport="device",
        transport_reason="",
        num_slots=8,
        slots_per_producer=2,
        slot_bytes=1 << 20,
        closing=False,
        age_s=60.0,
        taken_ns=int(taken_s * S),
        slot_states=["ready"] * 8,
        slot_owners=[0] * 8,
        slot_seqs=[0] * 8,
        slot_counts={"free": 0, "writing": 0, "ready": 8, "reading": 0},
        occupancy=1.0,
        producers_blocked_pct=0.0,
        consumers_starved_pct=0.0,
        ranks=ranks,
        interval_s=interval_s,
    )
