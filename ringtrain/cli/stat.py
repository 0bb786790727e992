"""ringtrain-stat: look at live rings without disturbing them.

    ringtrain-stat                 list live rings (naming /dev/shm segments that are not)
    ringtrain-stat RUN             slot states, occupancy, wait percentages, ranks, verdict,
                                   and the split of the node's GPUs the ranks' rates favour
                                   (RUN: the ring id, the run's name or its run directory)
    ringtrain-stat [RUN] --watch   refresh every --interval seconds (default 2), adding
                                   rates over the last interval, until the run ends
    --json                         machine-readable output (one JSON document per refresh)

Rings are mapped read-only (see ringtrain.ring.snapshot); this module only formats.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time

from ringtrain.monitor.advice import ring_advice
from ringtrain.monitor.verdict import ring_verdict
from ringtrain.ring.names import junk_segments
from ringtrain.ring.snapshot import RingReader, RingSnapshot, discover, open_ring, with_interval

_STATE_MARK = {"free": ".", "writing": "w", "ready": "R", "reading": "r"}


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:5.1f}%"


def format_snapshot(snap: RingSnapshot, previous: RingSnapshot | None = None) -> str:
    """Human-readable report of one snapshot, ending with the ring's verdict since `previous`
    (since start-up without one)."""
    counts = ", ".join(f"{n} {state}" for state, n in snap.slot_counts.items())
    lines = [
        f"ring {snap.run}  generation {snap.generation}  transport {snap.transport} "
        f"({snap.transport_reason})  up {snap.age_s:.0f} s" + ("  CLOSING" if snap.closing else ""),
        f"slots {snap.num_slots} x {snap.slot_bytes / (1 << 20):.1f} MiB: {counts}; "
        f"occupancy {100 * snap.occupancy:.0f}%",
        "slot states: "
        + "".join(_STATE_MARK[s] for s in snap.slot_states)
        + "  (. free, w writing, R ready, r reading)",
        f"producers blocked {_pct(snap.producers_blocked_pct)} over the run"
        + (
            f", {_pct(snap.interval_producers_blocked_pct)} last {snap.interval_s:.1f} s"
            if snap.interval_s
            else ""
        )
        + f"; consumers starved {_pct(snap.consumers_starved_pct)} over the run"
        + (
            f", {_pct(snap.interval_consumers_starved_pct)} last interval"
            if snap.interval_s
            else ""
        ),
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
            f"{r.rank:>4} {r.label:<7} {r.pid:>7} {status:<8} {r.heartbeat_age_s:>5.1f}s {r.step:>7} "
            f"{r.items:>8} {rate:>8.1f} {_pct(blocked) if r.is_producer else '-':>7} "
            f"{_pct(starved) if r.is_consumer else '-':>7} "
            f"{'-' if r.gpu_busy is None else _pct(100.0 * r.gpu_busy):>6}  {r.last_error[:60]}"
        )
    lines += ["", ring_verdict(snap, previous)]
    return "\n".join(lines)


def _group_lines(snap: RingSnapshot) -> list[str]:
    """One line naming the target groups and their ranks (none without target groups)."""
    if not snap.groups:
        return []
    named = ", ".join(
        f"target group {g} (ranks {','.join(map(str, ranks))})" for g, ranks in snap.groups.items()
    )
    return [f"{named}; each group is one producer, its first rank publishes"]


def role_split_advice(current: RingSnapshot, previous: RingSnapshot | None) -> list[str]:
    """Which split of the node's GPUs would be fastest, from the ranks' rates since `previous`
    (since they attached without one); nothing while a rank is dead or a role has no rate."""
    advice = ring_advice(current, previous)
    if not advice:
        return []
    span = f"over the last {current.interval_s:.1f} s" if previous else "since start-up"
    return [*advice, f"  (rates {span}, in batches; --watch measures each interval)"]


def _list(as_json: bool) -> int:
    rings = discover()
    for path, problem in junk_segments():
        print(
            f"ringtrain-stat: skipped {path}: {problem} (the next ring start on this host "
            "removes it)",
            file=sys.stderr,
        )
    if as_json:
        print(json.dumps([{"run": r.run, "path": r.path, "pids": list(r.pids)} for r in rings]))
    elif not rings:
        print("no live rings")
    else:
        for r in rings:
            print(f"{r.run}  (mapped by pids {', '.join(map(str, r.pids)) or 'none'})")
    return 0


def ring_ended(snap: RingSnapshot) -> bool:
    """Whether the run behind the ring is over: it is closing after a failure, or every
    rank has left it (closed, failed or gone)."""
    left = ("closed", "failed", "dead")
    return snap.closing or all(r.status in left or not r.alive for r in snap.ranks)


def _watch(reader: RingReader, as_json: bool, interval: float | None) -> int:
    """Print the ring once (``interval`` None) or every ``interval`` seconds until it ends."""
    previous = None
    while True:
        snap = reader.snapshot()
        if previous is not None:
            snap = with_interval(previous, snap)
        ended = ring_ended(snap)
        advice = [] if ended else role_split_advice(snap, previous)
        if as_json:
            report = {**dataclasses.asdict(snap), "verdict": ring_verdict(snap, previous)}
            print(json.dumps({**report, "ended": ended, "advice": advice}))
        else:
            status = [f"ring {snap.run} has ended: the run is over"] if ended else []
            text = format_snapshot(snap, previous)
            print("\n".join([text, *advice, *status]), end="\n\n", flush=True)
        sys.stdout.flush()
        if interval is None or ended:
            return 0
        previous = snap
        time.sleep(interval)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ringtrain-stat console script."""
    parser = argparse.ArgumentParser(
        prog="ringtrain-stat", description="Inspect live ringtrain rings (read-only)."
    )
    parser.add_argument(
        "run",
        nargs="?",
        help="ring id, run name or run directory; omit to list live rings (or, with "
        "--watch, to watch the only one)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--watch", action="store_true", help="refresh until the run ends")
    parser.add_argument(
        "--interval", type=float, default=2.0, metavar="SECONDS", help="refresh period (2)"
    )
    args = parser.parse_args(argv)
    try:
        if args.run is None and not args.watch:
            return _list(args.json)
        try:
            reader = open_ring(args.run)
        except (LookupError, ValueError) as exc:
            print(f"ringtrain-stat: {exc}", file=sys.stderr)
            return 2
        try:
            return _watch(reader, args.json, args.interval if args.watch else None)
        finally:
            reader.close()
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:
        # The reader of our output went away (e.g. `| head`): end quietly.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
