"""What ringtrain-stat shows: the live rings, and one ring's slots, ranks and verdict.

Rings are mapped read-only (ringtrain.ring.snapshot); this module only reads and formats.
The verdict is the trainer's own: the lead drafter keeps the verdict of each progress line
in that step's metrics record (trainer/progress.py), and stat shows the newest one, found
through the metrics file the lead drafter holds open (or the run directory given). Where
there is none yet (before the first progress line, or a ring whose run cannot be read),
stat judges the ring's counters itself, by the same function (monitor/verdict.py), over
its own window, and says which window that is. A dead or hung rank is always named first.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import msgspec

from ringtrain.monitor.verdict import Verdict, ring_judgement
from ringtrain.ring.names import junk_segments
from ringtrain.ring.snapshot import (
    RingLocation,
    RingReader,
    RingSnapshot,
    discover,
    open_ring,
    with_interval,
)

METRICS_FILE = "metrics.jsonl"
# How much of the end of metrics.jsonl is searched for the newest verdict.
TAIL_BYTES = 4 << 20
_STATE_MARK = {"free": ".", "writing": "w", "ready": "R", "reading": "r"}


@dataclasses.dataclass(frozen=True)
class ShownVerdict:
    """A verdict and the window it was judged over, in words."""

    verdict: Verdict
    window: str


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:5.1f}%"


def format_snapshot(
    snap: RingSnapshot, previous: RingSnapshot | None = None, shown: ShownVerdict | None = None
) -> str:
    """Human-readable report of one snapshot, ending with the verdict `shown` (by default
    the ring's own over the window since `previous`, or since start-up without one)."""
    shown = shown or live_verdict(snap, previous)
    counts = ", ".join(f"{n} {state}" for state, n in snap.slot_counts.items())
    lines = [
        f"ring {snap.run}  generation {snap.generation}  transport {snap.transport} "
        f"({snap.transport_reason})  up {snap.age_s:.0f} s" + ("  CLOSING" if snap.closing else ""),
        f"slots {snap.num_slots} x {snap.slot_bytes / (1 << 20):.1f} MiB: {counts}; "
        f"occupancy {100 * snap.occupancy:.0f}%",
        "slot states: "
        + "".join(_STATE_MARK[s] for s in snap.slot_states)
        + "  (. free, w writing, R ready, r reading)",
        _wait_line(snap),
        *_group_lines(snap),
        "",
        f"{'rank':>4} {'role':<7} {'pid':>7} {'status':<8} {'beat':>6} {'step':>7} {'items':>8} "
        f"{'items/s':>8} {'blocked':>7} {'starved':>7} {'gpu':>6}  last error",
    ]
    for r in snap.ranks:
        rate = r.interval_items_per_s if r.interval_items_per_s is not None else r.items_per_s
        blocked = r.interval_blocked_pct if r.interval_blocked_pct is not None else r.blocked_pct
        starved = r.interval_starved_pct if r.interval_starved_pct is not None else r.starved_pct
        status = r.status if r.alive else f"DEAD ({r.dead_reason})"
        lines.append(
            f"{r.rank:>4} {r.label:<7} {r.pid:>7} {status:<8} "
            f"{r.heartbeat_age_s:>5.1f}s {r.step:>7} "
            f"{r.items:>8} {rate:>8.1f} {_pct(blocked) if r.is_producer else '-':>7} "
            f"{_pct(starved) if r.is_consumer else '-':>7} "
            f"{'-' if r.gpu_busy is None else _pct(100.0 * r.gpu_busy):>6}  {r.last_error[:60]}"
        )
    lines += ["", f"verdict {shown.window}: {shown.verdict.line}"]
    return "\n".join(lines + shown.verdict.advice)


def _wait_line(snap: RingSnapshot) -> str:
    over = f", {{}} last {snap.interval_s:.1f} s" if snap.interval_s else ""
    return (
        f"producers blocked {_pct(snap.producers_blocked_pct)} over the run"
        + over.format(_pct(snap.interval_producers_blocked_pct))
        + f"; consumers starved {_pct(snap.consumers_starved_pct)} over the run"
        + over.format(_pct(snap.interval_consumers_starved_pct))
    )


def _group_lines(snap: RingSnapshot) -> list[str]:
    """One line naming the target groups and their ranks (none without target groups)."""
    if not snap.groups:
        return []
    named = ", ".join(
        f"target group {g} (ranks {','.join(map(str, ranks))})" for g, ranks in snap.groups.items()
    )
    return [f"{named}; each group is one producer, its first rank publishes"]


def live_verdict(current: RingSnapshot, previous: RingSnapshot | None) -> ShownVerdict:
    """The ring's verdict over stat's own window: since `previous`, else since start-up."""
    window = f"over the last {current.interval_s:.1f} s" if previous else "since start-up"
    return ShownVerdict(ring_judgement(current, previous), f"{window} (rates in batches)")


def recorded_verdict(metrics: Path | None) -> ShownVerdict | None:
    """The newest progress line's verdict in the run's metrics file (None: none yet)."""
    if metrics is None:
        return None
    try:
        with metrics.open("rb") as file:
            file.seek(max(file.seek(0, os.SEEK_END) - TAIL_BYTES, 0))
            lines = file.read().splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        if b'"verdict"' not in line:
            continue
        try:
            entry = msgspec.json.decode(line)["verdict"]
            first, last = entry["steps"]
            verdict = Verdict(str(entry["line"]), [str(a) for a in entry["advice"]])
        except (msgspec.DecodeError, KeyError, TypeError, ValueError):
            continue
        return ShownVerdict(verdict, f"over steps {first}-{last} (the trainer's progress line)")
    return None


def shown_verdict(
    current: RingSnapshot, previous: RingSnapshot | None, metrics: Path | None
) -> ShownVerdict:
    """What stat shows: a dead or hung rank first, then the trainer's newest verdict, else
    stat's own over its window."""
    if current.fatal:
        return ShownVerdict(Verdict(current.fatal), "now")
    return recorded_verdict(metrics) or live_verdict(current, previous)


def metrics_file(location: RingLocation, run: str | None) -> Path | None:
    """The run's metrics.jsonl: in the run directory given, else the one a process that
    maps the ring holds open (the lead drafter writes it)."""
    if run is not None and (Path(run).expanduser() / METRICS_FILE).is_file():
        return Path(run).expanduser() / METRICS_FILE
    for pid in location.pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.endswith(f"/{METRICS_FILE}"):
                return Path(target)
    return None


def is_own(location: RingLocation) -> bool:
    """Whether the ring's control segment belongs to the caller's user."""
    try:
        return os.stat(location.path).st_uid == os.getuid()
    except OSError:
        return False


def list_rings(as_json: bool, everyone: bool) -> int:
    """List the caller's live rings (every user's with `everyone`)."""
    rings = discover()
    others = 0 if everyone else sum(not is_own(r) for r in rings)
    rings = rings if everyone else [r for r in rings if is_own(r)]
    for path, problem in junk_segments():
        print(
            f"ringtrain-stat: skipped {path}: {problem} (the next ring start on this host "
            "removes it)",
            file=sys.stderr,
        )
    if as_json:
        print(json.dumps([{"run": r.run, "path": r.path, "pids": list(r.pids)} for r in rings]))
    elif not rings:
        print("no live rings of yours" if not everyone else "no live rings")
    else:
        for r in rings:
            print(f"{r.run}  (mapped by pids {', '.join(map(str, r.pids)) or 'none'})")
    if others and not as_json:
        print(f"({others} ring(s) of other users not shown: --all lists them)")
    return 0


def open_reader(run: str | None) -> RingReader:
    """The ring named by `run` (see snapshot.open_ring), or without one the caller's only
    live ring. Raises LookupError naming the choices."""
    if run is not None:
        return open_ring(run)
    own = [r for r in discover() if is_own(r)]
    if len(own) != 1:
        names = ", ".join(r.run for r in own) or "none"
        raise LookupError(f"{len(own)} live rings of yours ({names}): name one")
    return RingReader(own[0])


def ring_ended(snap: RingSnapshot) -> bool:
    """Whether the run behind the ring is over: it is closing after a failure, or every
    rank has left it (closed, failed or gone)."""
    left = ("closed", "failed", "dead")
    return snap.closing or all(r.status in left or not r.alive for r in snap.ranks)


def watch(reader: RingReader, run: str | None, as_json: bool, interval: float | None) -> int:
    """Print the ring once (`interval` None) or every `interval` seconds until it ends."""
    previous = None
    metrics = metrics_file(reader.location, run)
    while True:
        snap = reader.snapshot()
        if previous is not None:
            snap = with_interval(previous, snap)
        ended = ring_ended(snap)
        shown = shown_verdict(snap, previous, metrics)
        if as_json:
            verdict = shown.verdict
            report = {**dataclasses.asdict(snap), "verdict": verdict.line, "advice": verdict.advice}
            print(json.dumps({**report, "verdict_window": shown.window, "ended": ended}))
        else:
            status = [f"ring {snap.run} has ended: the run is over"] if ended else []
            print("\n".join([format_snapshot(snap, previous, shown), *status]), end="\n\n")
        sys.stdout.flush()
        if interval is None or ended:
            return 0
        previous = snap
        time.sleep(interval)
