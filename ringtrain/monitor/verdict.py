"""The ring's one-line verdict in the run's words, for progress lines and ringtrain-stat.

The ring knows which end limits it (RingSnapshot.bottleneck) and which rank ended the run
(RingSnapshot.fatal); this module names the ends as the trainer does (producers are the
targets, consumers the drafters) and adds what to do about a bottleneck: the split
analysis's own conclusion (advice.conclusion), so the line and the analysis never disagree.
"""

from __future__ import annotations

from ringtrain.monitor.advice import conclusion, ring_rates
from ringtrain.ring import CONSUMER, PRODUCER, RingSnapshot


def ring_verdict(
    current: RingSnapshot, previous: RingSnapshot | None, tokens_per_item: float | None = None
) -> str:
    """Who limits the ring since `previous` (over `current`'s interval when it has one, else
    since start-up) and what the split analysis of the same counters concludes; the dead or
    hung rank instead while there is one. `tokens_per_item` turns batches/s into tok/s."""
    if current.fatal:
        return current.fatal
    blocked, starved = current.waits
    if current.bottleneck is None:
        return f"balanced: ring full {blocked:.0f}%, drafters starved {starved:.0f}% of the time"
    who = {
        CONSUMER: f"drafters are the bottleneck: ring full {blocked:.0f}% of the time",
        PRODUCER: f"targets are the bottleneck: drafters starved {starved:.0f}% of the time",
    }[current.bottleneck]
    rates = ring_rates(current, previous, tokens_per_item)
    return who if rates is None else f"{who} - {conclusion(rates)}"
