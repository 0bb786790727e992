"""The ring's verdict and split advice (one judgement for ringtrain-stat, the progress
line and the summary) from ring snapshots with known rates."""

from __future__ import annotations

from dataclasses import replace

from ringtrain.monitor.stat_view import live_verdict
from ringtrain.monitor.verdict import ring_judgement
from ringtrain.ring import CONSUMER, RankSnapshot, with_interval
from tests.helpers.ring_snapshots import rank as _rank
from tests.helpers.ring_snapshots import snapshot as _snapshot


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
    lines = ring_judgement(after, before).advice
    text = "\n".join(lines)
    assert "over the node's 4 GPUs" in lines[0]
    assert "now  3 targets + 1 drafter: min(3 x 10, 1 x 6) = 6 batches/s (measured 6)" in text
    assert "best 2 targets + 2 drafters: min(2 x 10, 2 x 6) = 12 batches/s, 2.00x now" in text
    assert "=> 2 targets + 2 drafters would be fastest: ~12 batches/s" in text
    assert live_verdict(after, before).window == "over the last 10.0 s (rates in batches)"


def test_one_shot_advice_uses_the_rates_since_start_up() -> None:
    snapshot = _snapshot(_node(items=100, up_s=50.0, blocked_s=40.0))
    advice = ring_judgement(snapshot, None).advice
    assert "now  3 targets + 1 drafter: min(3 x 10, 1 x 6) = 6 batches/s" in "\n".join(advice)
    assert live_verdict(snapshot, None).window.startswith("since start-up")


def test_no_advice_while_a_rank_is_dead_or_before_both_roles_worked() -> None:
    ranks = _node(items=100, up_s=50.0, blocked_s=40.0)
    ranks[3] = replace(ranks[3], alive=False, dead_reason="died", status="dead")
    dead = ring_judgement(_snapshot(ranks), None)
    assert dead.advice == [] and dead.line.startswith("rank 3 (drafter) is dead: died")
    assert ring_judgement(_snapshot(_node(items=0, up_s=5.0, blocked_s=0.0)), None).advice == []


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
    verdict = ring_judgement(window, before)
    assert _conclusion(verdict.advice) == "the current split is the fastest"
    assert verdict.line == (
        "drafters are the bottleneck: ring full 80% of the time - the current split is the fastest"
    )


def test_the_split_now_is_not_compared_with_the_measured_rate_as_if_it_were_another() -> None:
    """Both ends waited part of the window, so the node moved less than the arithmetic of
    its own split predicts: the best split is the current one, and the analysis says so
    instead of printing a speed-up beside "the current split is the fastest"."""
    before = _snapshot(
        [_rank(0, "target", 100, 50.0, 20.0), _rank(1, "drafter", 100, 50.0, 10.0)], taken_s=50.0
    )
    # In 10 s: the target made 20 batches, blocked 5 s (4/s working); the drafter took
    # 20, starved 3 s (2.86/s working); measured 2/s, 1 + 1 predicts min(4, 2.86) = 2.86.
    after = _snapshot(
        [_rank(0, "target", 120, 60.0, 25.0), _rank(1, "drafter", 120, 60.0, 13.0)], taken_s=60.0
    )
    advice = ring_judgement(with_interval(before, after), before).advice
    text = "\n".join(advice)
    assert (
        "best 1 target + 1 drafter: min(1 x 4, 1 x 2.86) = 2.86 batches/s (the split now)" in text
    )
    assert "x now" not in text
    assert _conclusion(advice) == "the current split is the fastest"


def test_the_verdict_line_names_the_split_that_the_analysis_finds_fastest() -> None:
    before = _snapshot(_node(items=100, up_s=50.0, blocked_s=10.0), taken_s=50.0)
    after = _snapshot(_node(items=120, up_s=60.0, blocked_s=18.0), taken_s=60.0)
    window = with_interval(before, after)
    verdict = ring_judgement(window, before)
    conclusion = _conclusion(verdict.advice)
    assert conclusion == "2 targets + 2 drafters would be fastest: ~12 batches/s"
    assert verdict.line == f"drafters are the bottleneck: ring full 80% of the time - {conclusion}"
    # With tokens per batch known (the progress line), the same judgement in tok/s.
    assert ring_judgement(window, before, tokens_per_item=1000.0).line.endswith(
        "2 targets + 2 drafters would be fastest: ~12.0k tok/s"
    )


def test_a_drafter_that_starved_the_whole_window_counts_in_the_starvation() -> None:
    """One target feeds two drafters; drafter 3 got no batch in the window and waited all
    of it: the drafters starved half the time on average, so the targets limit the ring."""

    def ranks(items: int, up_s: float) -> list[RankSnapshot]:
        return [
            _rank(0, "target", items, up_s, 0.0),
            _rank(1, "drafter", items, up_s, 0.0),
            _rank(3, "drafter", 0, up_s, up_s),
        ]

    before = _snapshot(ranks(100, 50.0), taken_s=50.0)
    after = _snapshot(ranks(120, 60.0), taken_s=60.0)
    verdict = ring_judgement(with_interval(before, after), before)
    assert verdict.line.startswith("targets are the bottleneck: drafters starved 50% of the time")


def test_a_target_group_in_the_ring_counts_as_one_target_of_its_gpus() -> None:
    """Ranks 0 and 1 are one tensor-parallel target group (the lead, rank 0, publishes)."""

    def ranks(items: int, up_s: float) -> list[RankSnapshot]:
        lead = replace(_rank(0, "target", items, up_s, 0.0), group=0, member=0)
        member = replace(_rank(1, "target", 0, up_s, 0.0), group=0, member=1)
        drafters = [_rank(r, "drafter", items // 2, up_s, 0.0) for r in (2, 3)]
        return [lead, member, *drafters]

    before = _snapshot(ranks(100, 50.0), taken_s=50.0)
    after = _snapshot(ranks(120, 60.0), taken_s=60.0)
    advice = ring_judgement(with_interval(before, after), before).advice
    assert "one target group makes 2 batches/s" in advice[0]
    assert advice[1] == (
        "  now  1 target group of 2 GPUs + 2 drafters: min(1 x 2, 2 x 1) = 2 batches/s (measured 2)"
    )
