"""One verdict: the progress line, the summary and ringtrain-stat judge the same counters
by the same function, so at one moment they say the same thing."""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from importlib import resources
from pathlib import Path

import pytest

from ringtrain.config import parse_config
from ringtrain.monitor.stat_view import format_snapshot, live_verdict, shown_verdict
from ringtrain.monitor.verdict import ring_judgement
from ringtrain.ring import CONSUMER, PRODUCER, RingSnapshot, with_interval
from ringtrain.ring.snapshot import fatal_line, limiting_end
from ringtrain.trainer.logs import LOGGER_NAME, MetricsWriter
from ringtrain.trainer.progress import LeadReporter, Progress
from ringtrain.trainer.step_record import StepRecord
from tests.helpers.monitor_records import lead_step
from tests.helpers.ring_snapshots import rank, snapshot

TOKENS = 1000  # per batch


class ScriptedRing:
    """A ring whose snapshots are given in advance, one per call."""

    def __init__(self, snapshots: list[RingSnapshot]) -> None:
        self._snapshots = iter(snapshots)

    def snapshot(self) -> RingSnapshot:
        return next(self._snapshots)


def _ring_at(t: float, produced: int, blocked: float, consumed: int, starved: float):
    """1 target + 1 drafter, each on a GPU of its own, attached at t = 0."""
    ranks = [rank(0, "target", produced, t, blocked), rank(1, "drafter", consumed, t, starved)]
    return snapshot(ranks, taken_s=t)


# The drafter starves 38 s while the target loads and runs its first forward; then the
# ring fills and the target waits on it 71% of the time. Since start-up the drafters look
# starved (54%); over the last progress window the drafters are the bottleneck.
TIMELINE = [
    _ring_at(10.0, 0, 0.0, 0, 10.0),  # the session starts
    _ring_at(40.0, 3, 0.0, 1, 38.0),  # step 1
    _ring_at(50.0, 5, 7.0, 2, 38.0),  # step 2: a progress line
    _ring_at(60.0, 6, 14.1, 3, 38.0),  # step 3
    _ring_at(70.0, 7, 21.2, 4, 38.0),  # step 4: a progress line, the last step
    _ring_at(70.5, 7, 21.7, 4, 38.0),  # the checkpoint after it, when ringtrain-stat looks
]


def _record(step: int) -> StepRecord:
    return lead_step(step, TOKENS, seconds=10.0)


def test_progress_line_summary_and_stat_give_one_verdict(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    text = resources.files("ringtrain").joinpath("tiny.toml").read_text(encoding="utf-8")
    config = parse_config(text, "<tiny.toml>", ["run.max_steps=4", "run.log_every=2"])
    metrics_path = tmp_path / "metrics.jsonl"
    reporter = LeadReporter(MetricsWriter(metrics_path), Progress(config, ScriptedRing(TIMELINE)))
    with caplog.at_level(logging.INFO, logger=LOGGER_NAME):
        for step in range(1, 5):
            reporter.step(_record(step))
        reporter.close()

    before, after = TIMELINE[2], TIMELINE[4]
    expected = ring_judgement(with_interval(before, after), before, tokens_per_item=TOKENS)
    assert expected.line.startswith("drafters are the bottleneck: ring full 71% of the time - ")
    assert any(line.startswith("  => ") for line in expected.advice)
    (line,) = [m for m in caplog.messages if m.startswith("step 4/4 |")]
    assert line.endswith(f"ring 100% occupied | {expected.line}")

    records = [json.loads(row) for row in metrics_path.read_text().splitlines()]
    verdicts = [r["verdict"] for r in records if "verdict" in r]
    assert [v["steps"] for v in verdicts] == [[1, 2], [2, 4]]
    assert verdicts[-1] == {"steps": [2, 4], "line": expected.line, "advice": expected.advice}

    # ringtrain-stat at this moment: the same verdict and advice as the progress line, not
    # its own since-start-up judgement (which the start-up's starvation would tilt).
    shown = shown_verdict(TIMELINE[-1], None, metrics_path)
    assert (shown.verdict.line, shown.verdict.advice) == (expected.line, expected.advice)
    assert shown.window == "over steps 2-4 (the trainer's progress line)"
    assert live_verdict(TIMELINE[-1], None).verdict.line.startswith(
        "targets are the bottleneck: drafters starved 54%"
    )
    table = format_snapshot(TIMELINE[-1], None, shown)
    assert f"verdict over steps 2-4 (the trainer's progress line): {expected.line}" in table
    assert table.endswith("\n".join(expected.advice))

    # The summary: the same function over the session's steps after its first.
    summary = ring_judgement(TIMELINE[4], TIMELINE[1], tokens_per_item=TOKENS)
    assert f"ring over steps 1-4: {summary.line}" in caplog.messages
    assert summary.advice == caplog.messages[-len(summary.advice) :]


def test_stat_judges_the_ring_itself_where_the_run_recorded_no_verdict(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text('{"event": "start", "resumed_step": 0}\n')
    shown = shown_verdict(TIMELINE[2], None, tmp_path / "metrics.jsonl")
    assert shown == live_verdict(TIMELINE[2], None)
    assert shown.window == "since start-up (rates in batches)"


def test_the_limiting_end_needs_a_tenth_of_the_time_and_the_longer_wait() -> None:
    assert limiting_end(5.0, 3.0) is None
    assert limiting_end(15.0, 3.0) == CONSUMER
    assert limiting_end(3.0, 15.0) == PRODUCER
    assert limiting_end(20.0, 30.0) == PRODUCER


def test_an_interval_gives_each_ranks_rate_and_wait_and_the_drafters_total() -> None:
    # A target and two drafters, read 2 s apart.
    before = snapshot(
        [
            rank(0, "target", 10, 5.0, 1.0),
            rank(1, "drafter", 8, 5.0, 0.0),
            rank(2, "drafter", 8, 5.0, 0.0),
        ],
        taken_s=5.0,
    )
    after = snapshot(
        [
            rank(0, "target", 30, 7.0, 2.0),
            rank(1, "drafter", 14, 7.0, 0.5),
            rank(2, "drafter", 12, 7.0, 0.0),
        ],
        taken_s=7.0,
    )
    window = with_interval(before, after)
    assert [r.interval_items_per_s for r in window.ranks] == pytest.approx([10.0, 3.0, 2.0])
    assert window.interval_items_per_s == pytest.approx(5.0)  # what the drafters took
    assert window.interval_producers_blocked_pct == pytest.approx(50.0)
    assert window.interval_consumers_starved_pct == pytest.approx(12.5)


def test_a_dead_rank_then_a_hung_one_is_the_rings_fatal_line() -> None:
    well = [rank(0, "target", 1, 1.0, 0.0), rank(1, "drafter", 1, 1.0, 0.0)]
    assert fatal_line(well) is None
    hung = [well[0], replace(well[1], hung_reason="is hung: no progress for 40 s")]
    assert fatal_line(hung) == (
        "rank 1 (drafter) is hung: no progress for 40 s - the run cannot continue"
    )
    dead = replace(well[0], alive=False, dead_reason="died (process 1000 is gone)")
    assert fatal_line([dead, hung[1]]) == (
        "rank 0 (target) is dead: died (process 1000 is gone) - the run cannot continue"
    )
