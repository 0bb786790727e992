"""ringtrain-plot: one PNG of a run, live or finished.

    ringtrain-plot RUN_DIR               writes RUN_DIR/run.png
    ringtrain-plot RUN_DIR -o out.png    writes out.png

Loss and tau against the step (held-out evaluations marked), tokens/s, ring occupancy and
who waits on whom, GPU busy per rank, accuracy per block position, restarts marked. Needs
matplotlib (`pip install 'ringtrain[plot]'`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ringtrain.monitor.runlog import METRICS_FILE, RunDirError, read_run
from ringtrain.process_end import process_entry

MALFORMED_SHOWN = 5


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ringtrain-plot console script."""
    parser = argparse.ArgumentParser(
        prog="ringtrain-plot", description="Draw one PNG of a training run (live or finished)."
    )
    parser.add_argument("run_dir", type=Path, help="the run directory (run.run_dir)")
    parser.add_argument(
        "-o", "--output", type=Path, help="PNG file to write (default: RUN_DIR/run.png)"
    )
    parser.add_argument("--dpi", type=int, default=80, help="resolution (default 80)")
    args = parser.parse_args(argv)
    try:
        run = read_run(args.run_dir)
    except RunDirError as exc:
        print(f"ringtrain-plot: {exc}", file=sys.stderr)
        return 2
    try:
        from ringtrain.monitor.figure import render
    except ImportError as exc:
        print(
            f"ringtrain-plot: needs matplotlib ({exc}): pip install 'ringtrain[plot]'",
            file=sys.stderr,
        )
        return 2
    for problem in run.malformed[:MALFORMED_SHOWN]:
        print(f"ringtrain-plot: skipped {METRICS_FILE} {problem}", file=sys.stderr)
    if len(run.malformed) > MALFORMED_SHOWN:
        more = len(run.malformed) - MALFORMED_SHOWN
        print(f"ringtrain-plot: skipped {more} more malformed record(s)", file=sys.stderr)
    output = render(run, args.output or args.run_dir / "run.png", dpi=args.dpi)
    skipped = f" ({run.unreadable} unreadable line(s) skipped)" if run.unreadable else ""
    if run.malformed:
        skipped += f" ({len(run.malformed)} malformed record(s) skipped)"
    print(f"{output}: {len(run.steps)} steps, {len(run.evals)} evaluations{skipped}")
    return 0


# The console script's entry point (pyproject.toml) and python -m's.
run = process_entry(main)

if __name__ == "__main__":
    run()
