"""The verdict line's figures (ringtrain.monitor.verdict.judge): the two waits of a balanced
ring in their places, and a target group counted by its lead alone."""

from __future__ import annotations

from ringtrain.monitor.ring_figures import RankInterval
from ringtrain.monitor.verdict import judge, wait_shares


def test_a_balanced_ring_gives_each_wait_its_own_words() -> None:
    """Targets blocked 6% of a 10 s window, drafters starved 3%: neither end limits."""
    ranks = [
        RankInterval(0, "target", 0, items=40, seconds=10.0, waited_s=0.6),
        RankInterval(1, "drafter", 1, items=40, seconds=10.0, waited_s=0.3),
    ]
    verdict = judge(ranks)
    assert verdict.line.startswith("balanced: ring full 6%, drafters starved 3% of the time - ")
    assert verdict.advice


def test_a_target_groups_member_that_never_publishes_does_not_dilute_the_wait() -> None:
    """Ranks 0 and 1 are one tensor-parallel target group: the lead, blocked 40% of the
    window, publishes; the member moves nothing and waits on nothing."""
    ranks = [
        RankInterval(0, "target", 0, items=30, seconds=10.0, waited_s=4.0),
        RankInterval(1, "target", 1, items=0, seconds=10.0, waited_s=0.0),
        RankInterval(2, "drafter", 2, items=30, seconds=10.0, waited_s=0.5),
    ]
    assert wait_shares(ranks) == (40.0, 5.0)
    line = judge(ranks, gpus_per_target=2).line
    assert line.startswith("drafters are the bottleneck: ring full 40% of the time - ")
