"""`ringtrain-data synthesize`: user prompts written by the target from its chat template alone.

The parser is built without torch or transformers (help answers at once); the command
imports them when it runs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ringtrain.cli.arg_types import json_object
from ringtrain.data.errors import DatasetError
from ringtrain.data.synth_steering import DEFAULT_TOPIC_HINT
from ringtrain.interrupts import report_stop, stop_name

SYNTHESIZE_HELP = """\
Write chat prompts with the target alone (the Magpie method): the model is given its
chat template's text up to a user turn's content (with the template's default system
message, or --system) and writes the user's request itself, sampled at --temperature.
Topics steer it: each --topic is put into the system message the model writes under as
--topic-hint (not into the conversation written). Written turns are dropped when empty,
cut at --max-tokens, outside --min-words/--max-words, leaking the template (special
tokens, role headers), in the assistant's voice (refusals) or not text; prompts near
one already written (MinHash Jaccard >= --near-duplicate over word 3-grams) are dropped.
--turns 2 answers each prompt greedily with the target and writes a follow-up user turn
after the answer. The output is chat JSONL ({"messages": [...]}) for `ringtrain-data
regenerate`. Rerunning the same command continues the output (a larger --num extends
it); other settings are refused. Exit status: 0 done, 2 bad arguments, files or model,
130 interrupted."""


def _topics(args: argparse.Namespace) -> list[str]:
    """The --topic values, then the lines of the --topics files (blank lines skipped)."""
    topics = list(args.topic or [])
    for path in args.topics or []:
        try:
            lines = Path(path).read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise DatasetError(f"--topics {path}: cannot read it ({exc.strerror})") from None
        topics += [line.strip() for line in lines if line.strip()]
    return topics


def add_synthesize_parser(commands: argparse._SubParsersAction) -> None:
    """The `synthesize` subcommand and its options."""
    parser = commands.add_parser(
        "synthesize",
        help="write chat prompts with the target from its chat template (Magpie)",
        description=SYNTHESIZE_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = parser.add_argument
    add("--target", required=True, type=Path, help="local chat (instruct) model directory")
    add("--output", required=True, type=Path, help="chat JSONL (continued if present)")
    add("--num", required=True, type=int, help="conversations to write")
    add("--resume", action="store_true", help="continue --output; an error if it is missing")
    add("--system", action="append", help="a system message (repeatable: cycled)")
    add("--topic", action="append", help="a topic or task to steer by (repeatable: cycled)")
    add("--topics", action="append", metavar="FILE", help="a file of topics, one per line")
    add(
        "--topic-hint", default=DEFAULT_TOPIC_HINT, help="how a topic steers (default: %(default)r)"
    )
    add("--turns", type=int, choices=[1, 2], default=1, help="user turns per conversation")
    add("--temperature", type=float, default=1.0, help="sampling temperature (default 1)")
    add("--top-p", type=float, default=1.0, help="nucleus sampling mass (default 1: off)")
    add("--seed", type=int, default=0, help="sampling seed (default 0)")
    add("--max-tokens", type=int, default=256, help="per user turn; longer ones are dropped")
    add("--answer-tokens", type=int, default=512, help="--turns 2: per greedy answer")
    add("--min-words", type=int, default=3, help="shorter user turns are dropped (default 3)")
    add("--max-words", type=int, default=400, help="longer user turns are dropped (default 400)")
    add(
        "--near-duplicate",
        type=float,
        default=0.7,
        help="drop a prompt this similar to one written (Jaccard, default 0.7)",
    )
    add("--chat-template-kwargs", type=json_object, help="JSON object for the chat template")
    add("--device", choices=["auto", "cpu", "cuda"], default="auto", help="default auto")
    add(
        "--dtype",
        choices=["auto", "bfloat16", "float32"],
        default="auto",
        help="default auto (bfloat16 on GPU, float32 on CPU)",
    )
    add("--batch-size", type=int, default=0, help="rows per round (default 2048 GPU, 64 CPU)")
    add("--no-progress", action="store_true", help="no progress bar")


def run_synthesize(args: argparse.Namespace) -> int:
    """Run the command; returns the exit status (DatasetError is the caller's: status 2)."""
    try:
        from ringtrain.data.synthesize import SynthesisOptions, summary, synthesize
    except ImportError as exc:
        raise DatasetError(
            f"synthesize needs {exc.name}: pip install 'ringtrain[synthesize]'"
        ) from None
    options = SynthesisOptions(
        target=args.target.expanduser(),
        output=args.output,
        num=args.num,
        systems=list(args.system or []),
        topics=_topics(args),
        topic_hint=args.topic_hint,
        turns=args.turns,
        temperature=args.temperature,
        top_p=args.top_p,
        seed=args.seed,
        max_tokens=args.max_tokens,
        answer_tokens=args.answer_tokens,
        min_words=args.min_words,
        max_words=args.max_words,
        near_duplicate=args.near_duplicate,
        chat_template_kwargs=args.chat_template_kwargs,
        device=args.device,
        dtype=args.dtype,
        batch_size=args.batch_size,
        resume=args.resume,
    )
    try:
        totals = synthesize(options, progress=None if args.no_progress else sys.stderr)
    except KeyboardInterrupt as stop:
        return report_stop(stop_name(stop), "conversations", args.output)
    print(summary(options, totals))
    return 0
