"""What ringtrain-stat prints, on snapshots with chosen counters (the ring itself is tested in
test_stat): the report's lines, the verdict it ends with and where it comes from, the
metrics file it reads, the ring it opens and when a watched ring has ended."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from ringtrain.monitor import stat_view
from ringtrain.monitor.stat_view import (
    format_snapshot,
    live_verdict,
    metrics_file,
    open_reader,
    recorded_verdict,
    ring_ended,
    shown_verdict,
)
from ringtrain.monitor.verdict import Verdict
from ringtrain.ring.snapshot import RingLocation
from tests.helpers.ring_snapshots import rank, snapshot

TARGET = replace(rank(0, "target", 90, 60.0, 6.0), blocked_pct=10.0, gpu_busy=0.5)
DRAFTER = replace(rank(1, "drafter", 90, 60.0, 3.0), starved_pct=5.0, step=42)


def _row(report: str, number: int) -> str:
    return next(line for line in report.splitlines() if line.lstrip().startswith(f"{number} "))


def test_the_report_shows_the_slots_and_each_ranks_share_of_its_own_end() -> None:
    snap = replace(
        snapshot([TARGET, DRAFTER]),
        slot_states=["ready", "reading", "writing", "free", "ready", "ready", "free", "free"],
    )
    report = format_snapshot(snap, shown=stat_view.ShownVerdict(Verdict("fine", []), "now"))
    assert "slot states: Rrw.RR..  (. free, w writing, R ready, r reading)" in report
    assert "producers blocked   0.0% over the run; consumers starved   0.0% over the run" in report
    target, drafter = _row(report, 0).split(), _row(report, 1).split()
    assert target[:3] == ["0", "target", "1000"]
    assert target[6:10] == ["90", "1.5", "10.0%", "-"] and target[10] == "50.0%"
    assert drafter[5:10] == ["42", "90", "1.5", "-", "5.0%"] and drafter[10] == "-"
    assert report.splitlines()[-1] == "verdict now: fine"


def test_over_a_window_the_report_shows_the_windows_rates_and_waits() -> None:
    windowed = replace(TARGET, interval_items_per_s=4.0, interval_blocked_pct=25.0)
    snap = replace(
        snapshot([windowed, DRAFTER], interval_s=2.0),
        interval_producers_blocked_pct=25.0,
        interval_consumers_starved_pct=0.0,
    )
    report = format_snapshot(snap, previous=snapshot([TARGET, DRAFTER]))
    assert (
        "producers blocked   0.0% over the run,  25.0% last 2.0 s; consumers starved   0.0% "
        "over the run,   0.0% last 2.0 s"
    ) in report
    assert _row(report, 0).split()[7:9] == ["4.0", "25.0%"]
    assert "verdict over the last 2.0 s (rates in batches): " in report


def test_a_dead_rank_is_shown_dead_and_named_first_in_the_verdict(tmp_path: Path) -> None:
    dead = replace(DRAFTER, alive=False, status="attached", dead_reason="its process is gone")
    snap = snapshot([TARGET, dead])
    metrics = _metrics(tmp_path, [_verdict_record(5, 9, "drafters limit")])
    shown = shown_verdict(snap, None, metrics)
    assert (shown.window, shown.verdict.line) == (
        "now",
        "rank 1 (drafter) is dead: its process is gone - the run cannot continue",
    )
    assert "DEAD (its process is gone)" in _row(format_snapshot(snap, shown=shown), 1)
    assert not ring_ended(snap)  # until the target has left too


def test_target_groups_are_named_with_their_ranks() -> None:
    members = [replace(TARGET, rank=r, group=r // 2, member=r % 2) for r in range(4)]
    report = format_snapshot(snapshot([*members, replace(DRAFTER, rank=4)]))
    assert (
        "target group 0 (ranks 0,1), target group 1 (ranks 2,3); each group is one producer, "
        "its first rank publishes"
    ) in report
    assert "target group" not in format_snapshot(snapshot([TARGET, DRAFTER]))


def _verdict_record(first: int, last: int, line: str) -> str:
    verdict = {"steps": [first, last], "line": line, "advice": [f"advice after {last}"]}
    return json.dumps({"event": "step", "step": last, "verdict": verdict})


def _metrics(directory: Path, lines: list[str]) -> Path:
    path = directory / "metrics.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_the_trainers_newest_verdict_is_shown_over_stats_own(tmp_path: Path) -> None:
    metrics = _metrics(
        tmp_path,
        [
            _verdict_record(1, 4, "targets limit"),
            json.dumps({"event": "step", "step": 5}),
            _verdict_record(5, 9, "drafters limit"),
            '{"event": "step", "step": 10, "verdict": {"steps": [10',  # torn: being written
        ],
    )
    shown = recorded_verdict(metrics)
    assert shown is not None
    assert (shown.verdict.line, shown.verdict.advice) == ("drafters limit", ["advice after 9"])
    assert shown.window == "over steps 5-9 (the trainer's progress line)"
    snap = snapshot([TARGET, DRAFTER])
    assert shown_verdict(snap, None, metrics) == shown
    assert shown_verdict(snap, None, None) == live_verdict(snap, None)
    assert live_verdict(snap, None).window == "since start-up (rates in batches)"
    assert recorded_verdict(tmp_path / "missing.jsonl") is None


def test_the_run_directory_given_names_the_metrics_file(tmp_path: Path) -> None:
    location = RingLocation(run="t", path="/dev/shm/none", pids=())
    assert metrics_file(location, str(tmp_path)) is None
    metrics = _metrics(tmp_path, [])
    assert metrics_file(location, str(tmp_path)) == metrics
    with metrics.open() as held:  # as the lead drafter holds it
        assert metrics_file(RingLocation("t", "/dev/shm/none", (os.getpid(),)), None) == Path(
            os.path.realpath(held.name)
        )


def test_without_a_name_only_a_single_ring_of_ones_own_is_opened(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rings = [RingLocation(f"r{i}", f"/dev/shm/r{i}", ()) for i in range(2)]
    monkeypatch.setattr(stat_view, "is_own", lambda _location: True)
    for found, message in ((rings, "2 live rings of yours (r0, r1): name one"),
                           ([], "0 live rings of yours (none): name one")):  # fmt: skip
        monkeypatch.setattr(stat_view, "discover", lambda found=found: found)
        with pytest.raises(LookupError, match=message.replace("(", r"\(").replace(")", r"\)")):
            open_reader(None)


def test_only_ones_own_rings_are_listed_unless_everyones(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    mine, theirs = RingLocation("mine", "/a", (7,)), RingLocation("theirs", "/b", ())
    monkeypatch.setattr(stat_view, "discover", lambda: [mine, theirs])
    monkeypatch.setattr(stat_view, "is_own", lambda location: location is mine)
    monkeypatch.setattr(stat_view, "junk_segments", lambda: [])
    stat_view.list_rings(as_json=False, everyone=False)
    assert capsys.readouterr().out.splitlines() == [
        "mine  (mapped by pids 7)",
        "(1 ring(s) of other users not shown: --all lists them)",
    ]
    stat_view.list_rings(as_json=False, everyone=True)
    assert capsys.readouterr().out.splitlines() == [
        "mine  (mapped by pids 7)",
        "theirs  (mapped by pids none)",
    ]


def test_a_ring_has_ended_when_it_closes_or_every_rank_has_left() -> None:
    left = replace(TARGET, status="closed")
    assert not ring_ended(snapshot([TARGET, DRAFTER]))
    assert not ring_ended(snapshot([left, DRAFTER]))
    assert ring_ended(snapshot([left, replace(DRAFTER, status="failed")]))
    assert ring_ended(replace(snapshot([TARGET, DRAFTER]), closing=True))
