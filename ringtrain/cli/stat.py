"""ringtrain-stat: look at live rings without disturbing them.

    ringtrain-stat                 list your live rings (naming /dev/shm segments that are
                                   not rings); --all lists every user's
    ringtrain-stat RUN             slot states, occupancy, wait percentages, ranks, and the
                                   run's verdict with the split of the node's GPUs that the
                                   ranks' rates favour (RUN: the ring id, the run's name or
                                   its run directory)
    ringtrain-stat [RUN] --watch   refresh every --interval seconds (default 2), adding
                                   rates over the last interval, until the run ends
    --json                         machine-readable output (one JSON document per refresh)
    ringtrain-stat --clean         remove the shared-memory objects of rings whose processes
                                   are all dead (a run killed while creating its ring)

Arguments are parsed before anything heavy is imported, so --help and argument errors
answer at once; the work is in ringtrain.monitor.stat_view.
"""

from __future__ import annotations

import argparse
import os
import sys

from ringtrain.process_end import process_entry


def build_parser() -> argparse.ArgumentParser:
    """ringtrain-stat's arguments."""
    parser = argparse.ArgumentParser(
        prog="ringtrain-stat", description="Inspect live ringtrain rings (read-only)."
    )
    parser.add_argument(
        "run",
        nargs="?",
        help="ring id, run name or run directory; omit to list your live rings (or, with "
        "--watch, to watch your only one)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--watch", action="store_true", help="refresh until the run ends")
    parser.add_argument(
        "--interval", type=float, default=2.0, metavar="SECONDS", help="refresh period (2)"
    )
    parser.add_argument(
        "--all", action="store_true", help="list every user's rings, not only yours"
    )
    parser.add_argument(
        "--clean",
        action="store_true",
        help="remove the shared-memory objects of rings whose processes are all dead",
    )
    return parser


def clean() -> int:
    """Remove dead rings' objects and say what went (ringtrain-stat --clean)."""
    from ringtrain.ring.names import remove_dead_runs

    removed = remove_dead_runs()
    for run, objects in removed.items():
        print(f"removed {len(objects)} shared-memory objects of dead ring {run}")
    if not removed:
        print("no shared-memory objects of dead rings")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ringtrain-stat console script."""
    args = build_parser().parse_args(argv)
    if args.interval <= 0:
        print("ringtrain-stat: --interval must be above 0 seconds", file=sys.stderr)
        return 2
    try:
        if args.clean:
            return clean()
        from ringtrain.monitor import stat_view  # torch and the ring code load only now

        if args.run is None and not args.watch:
            return stat_view.list_rings(args.json, args.all)
        try:
            reader = stat_view.open_reader(args.run)
        except (LookupError, ValueError) as exc:
            print(f"ringtrain-stat: {exc}", file=sys.stderr)
            return 2
        try:
            interval = args.interval if args.watch else None
            return stat_view.watch(reader, args.run, args.json, interval)
        finally:
            reader.close()
    except KeyboardInterrupt:
        return 0
    except BrokenPipeError:
        # The reader of our output went away (e.g. `| head`): end quietly.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


# The console script's entry point (pyproject.toml) and python -m's.
run = process_entry(main)

if __name__ == "__main__":
    run()
