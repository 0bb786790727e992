"""ringtrain-stat's role-split advice and the ring's verdict line from ring snapshots with
known rates."""

from __future__ import annotations

from dataclasses import replace

from ringtrain.cli.stat import role_split_advice
from ringtrain.monitor.verdict import ring_verdict
from ringtrain.ring import CONSUMER, PRODUCER, RankSnapshot, RingSnapshot, with_interval

S = 1_000_000_000  # ns


def _rank(rank: int, role: str, items: int, up_s: float, waited_s: float) -> RankSnapshot:
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


def _snapshot(
    ranks: list[RankSnapshot], interval_s: float | None = None, taken_s: float = 0.0
) -> RingSnapshot:
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


def _node(items: int, up_s: float, blocked_s: float) -> list[RankSnapshot]:
    """Three targets that block `blocked_s` each and one drafter that never starves."""
    targets = [_rank(r, "target", items, up_s, blocked_s) for r in range(3)]
    return [*targets, _rank(3, "drafter", 3 * items, up_s, 0.0)]


def test_advice_over_an_interval_finds_the_known_best_split() -> None:
    before = _snapshot(_node(items=100, up_s=50.0, blocked_s=10.0))
    # In 10 s each target made 20 batches while blocked 8 s (10/s working); the drafter
    # took 60 (6/s). Four GPUs: 3 + 1 moves min(30, 6) = 6, 2 + 2 min(20, 12) = 12,
    # 1 + 3 min(10, 18) = 10.
    after = _snapshot(_node(items=120, up_s=60.0, blocked_s=18.0), interval_s=10.0)
    lines = role_split_advice(after, before)
    text = "\n".join(lines)
    assert "over the node's 4 GPUs" in lines[0]
    assert "now  3 targets + 1 drafter: min(3 x 10, 1 x 6) = 6 batches/s (measured 6)" in text
    assert "best 2 targets + 2 drafters: min(2 x 10, 2 x 6) = 12 batches/s, 2.00x now" in text
    assert "=> 2 targets + 2 drafters would be fastest: ~12 batches/s" in text
    assert lines[-1] == "  (rates over the last 10.0 s, in batches; --watch measures each interval)"


def test_one_shot_advice_uses_the_rates_since_start_up() -> None:
    lines = role_split_advice(_snapshot(_node(items=100, up_s=50.0, blocked_s=40.0)), None)
    assert "now  3 targets + 1 drafter: min(3 x 10, 1 x 6) = 6 batches/s" in "\n".join(lines)
    assert "since start-up" in lines[-1]


def test_no_advice_while_a_rank_is_dead_or_before_both_roles_worked() -> None:
    ranks = _node(items=100, up_s=50.0, blocked_s=40.0)
    ranks[3] = replace(ranks[3], alive=False, dead_reason="died", status="dead")
    assert role_split_advice(_snapshot(ranks), None) == []
    assert role_split_advice(_snapshot(_node(items=0, up_s=5.0, blocked_s=0.0)), None) == []


def _conclusion(advice: list[str]) -> str:
    """The split analysis's conclusion: its `=>` line, without the arrow."""
    (line,) = [line for line in advice if line.startswith("  => ")]
    return line.removeprefix("  => ")


def test_a_one_plus_one_run_with_slow_drafters_hears_one_judgement() -> None:
    """1 target + 1 drafter, each on a GPU of its own, the target blocked on a full ring 80%
    of the time: the drafters are the bottleneck, yet 1 + 1 is the only split of two GPUs,
    so the verdict line must not ask for more drafters while the analysis says this split
    is the fastest."""
    before = _snapshot(
        [_rank(0, "target", 100, 50.0, 40.0), _rank(1, "drafter", 100, 50.0, 0.0)], taken_s=50.0
    )
    after = _snapshot(
        [_rank(0, "target", 120, 60.0, 48.0), _rank(1, "drafter", 120, 60.0, 0.0)], taken_s=60.0
    )
    window = with_interval(before, after)
    assert window.bottleneck == CONSUMER
    advice = role_split_advice(window, before)
    assert _conclusion(advice) == "the current split is the fastest"
    verdict = ring_verdict(window, before)
    assert verdict == (
        "drafters are the bottleneck: ring full 80% of the time - the current split is the fastest"
    )


def test_the_verdict_line_names_the_split_that_the_analysis_finds_fastest() -> None:
    before = _snapshot(_node(items=100, up_s=50.0, blocked_s=10.0), taken_s=50.0)
    after = _snapshot(_node(items=120, up_s=60.0, blocked_s=18.0), taken_s=60.0)
    window = with_interval(before, after)
    conclusion = _conclusion(role_split_advice(window, before))
    assert conclusion == "2 targets + 2 drafters would be fastest: ~12 batches/s"
    assert ring_verdict(window, before) == (
        f"drafters are the bottleneck: ring full 80% of the time - {conclusion}"
    )
    # With tokens per batch known (the progress line), the same judgement in tok/s.
    assert ring_verdict(window, before, tokens_per_item=1000.0).endswith(
        "2 targets + 2 drafters would be fastest: ~12.0k tok/s"
    )
