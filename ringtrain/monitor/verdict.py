"""The ring's one verdict: which end limits it, and which split of the node would be fastest.

One function (`judge`) turns one window of the ranks' ring counters into the verdict line
and the split analysis; the trainer's progress line, its end-of-run summary and
ringtrain-stat all call it (through `ring_judgement` for ring snapshots), so the same
counters always give the same words. The line names the ends as the trainer does
(producers are the targets, consumers the drafters), says how long the other end waited,
and ends with the split analysis's own conclusion (advice.conclusion), so the line and the
analysis never disagree. While a rank is dead or hung the line names it instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ringtrain.monitor.advice import advise, conclusion, measured_rates
from ringtrain.monitor.ring_figures import RankInterval, snapshot_intervals
from ringtrain.ring import CONSUMER, PRODUCER, RingSnapshot
from ringtrain.ring.snapshot import limiting_end


@dataclass(frozen=True)
class Verdict:
    """The verdict over one window: its line and the split analysis (no analysis before
    both roles have a rate, or while a rank is dead)."""

    line: str
    advice: list[str] = field(default_factory=list)


def wait_shares(ranks: list[RankInterval]) -> tuple[float, float]:
    """(% of the window the targets were blocked on a full ring, % the drafters starved on
    an empty one), each the mean over the ranks of that role that used the ring in the
    window (a target group's members never do: their lead publishes)."""

    def mean_pct(role: str) -> float:
        shares = [r.wait_share for r in ranks if r.role == role and (r.items or r.waited_s > 0)]
        return 100.0 * sum(shares) / len(shares) if shares else 0.0

    return mean_pct("target"), mean_pct("drafter")


def judge(
    ranks: list[RankInterval], tokens_per_item: float | None = None, gpus_per_target: int = 1
) -> Verdict:
    """The verdict over one window of the ranks' counters (`tokens_per_item` turns
    batches/s into tok/s; `gpus_per_target`: a tensor-parallel target group's size)."""
    blocked, starved = wait_shares(ranks)
    who = {
        None: f"balanced: ring full {blocked:.0f}%, drafters starved {starved:.0f}% of the time",
        CONSUMER: f"drafters are the bottleneck: ring full {blocked:.0f}% of the time",
        PRODUCER: f"targets are the bottleneck: drafters starved {starved:.0f}% of the time",
    }[limiting_end(blocked, starved)]
    rates = measured_rates(ranks, tokens_per_item, gpus_per_target)
    if rates is None:
        return Verdict(who)
    return Verdict(f"{who} - {conclusion(rates)}", advise(rates))


def ring_judgement(
    current: RingSnapshot, previous: RingSnapshot | None, tokens_per_item: float | None = None
) -> Verdict:
    """The verdict over the ring's counters since `previous` (since the ranks attached
    without one); the dead or hung rank, with no analysis, while there is one."""
    if current.fatal:
        return Verdict(current.fatal)
    group_size = max(map(len, current.groups.values()), default=1)
    return judge(snapshot_intervals(current, previous), tokens_per_item, group_size)
