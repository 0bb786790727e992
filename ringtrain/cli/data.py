"""`ringtrain-data`: prepare a training dataset from chat JSONL, or inspect one.

ringtrain-data prepare --tokenizer TARGET_DIR --input chats.jsonl --output data/ [--max-len N] [--workers N]
ringtrain-data inspect data/ [--vocab-size V] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from ringtrain.data.errors import DatasetError
from ringtrain.data.prepare import prepare_dataset
from ringtrain.data.stats import dataset_statistics, format_statistics

PREPARE_HELP = """\
Tokenize chat JSONL with the target's tokenizer and chat template into an Arrow dataset.
Each line: {"messages": [{"role": ..., "content": ...}, ...]} or {"conversations": [...]}
(role/content, or ShareGPT from/value). The loss mask marks the assistant turns.
DFlash trains the drafter on the TARGET's own outputs: regenerate the assistant
responses with the target model (its chat template, your serving sampling settings)
before preparing; answers written by another model lower the acceptance length."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ringtrain-data", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    prepare = commands.add_parser(
        "prepare",
        help="chat JSONL -> Arrow dataset",
        description=PREPARE_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    prepare.add_argument("--tokenizer", required=True, help="local target model/tokenizer dir")
    prepare.add_argument("--input", required=True, help="chat JSONL file")
    prepare.add_argument("--output", required=True, help="new dataset directory")
    prepare.add_argument("--max-len", type=int, default=None, help="truncate rows to N tokens")
    prepare.add_argument(
        "--workers", type=int, default=os.cpu_count() or 1, help="processes (default: all cores)"
    )
    inspect = commands.add_parser("inspect", help="validate a dataset and print statistics")
    inspect.add_argument("path", help="dataset directory or file")
    inspect.add_argument("--vocab-size", type=int, default=None, help="check token ids < V")
    inspect.add_argument(
        "--block-size", type=int, default=16, help="drafter block size (rows dropped below 2x)"
    )
    inspect.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (2 on a bad dataset or input)."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "prepare":
            totals = prepare_dataset(
                args.tokenizer,
                args.input,
                args.output,
                max_len=args.max_len,
                workers=max(1, args.workers),
            )
            print(
                f"{args.output}: {totals.samples} samples, {totals.tokens} tokens, "
                f"{totals.supervised_tokens} supervised tokens; dropped {totals.dropped} "
                f"without assistant tokens, truncated {totals.truncated} "
                f"(of {totals.conversations} conversations)"
            )
        else:
            stats = dataset_statistics(
                args.path, vocab_size=args.vocab_size, block_size=args.block_size
            )
            print(json.dumps(stats) if args.json else format_statistics(stats))
    except DatasetError as exc:
        print(f"ringtrain-data: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
