r"""`ringtrain-data`: synthesize, regenerate, prepare, check and inspect training data.

Synthesize chat prompts with the target, regenerate chat JSONL with it, prepare a
training dataset from it (one file or a mixture), check it for overlap with evaluation
prompts, or inspect a dataset.

ringtrain-data synthesize --target MODEL_DIR --output prompts.jsonl --num N [--turns 2] [--topic T]
ringtrain-data regenerate --server URL --model NAME --input chats.jsonl --output regenerated.jsonl
ringtrain-data regenerate --local MODEL_DIR --input chats.jsonl --output regenerated.jsonl
ringtrain-data prepare --tokenizer TARGET_DIR --input chats.jsonl --output data/ \
    [--max-len N] [--workers N] [--block-size B]
ringtrain-data prepare --tokenizer TARGET_DIR --mixture mixture.toml --output data/ [...]
ringtrain-data overlap --train chats.jsonl --against mt-bench --against humaneval [--ngram 13]
ringtrain-data inspect data/ [--vocab-size V] [--block-size B] \
    [--row N --tokenizer TARGET_DIR] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ringtrain.cli.arg_types import json_object, whole
from ringtrain.cli.data_overlap import add_overlap_parser, run_overlap
from ringtrain.cli.data_synthesize import add_synthesize_parser, run_synthesize
from ringtrain.data.errors import DatasetError
from ringtrain.data.prepare import (
    DEFAULT_BLOCK_SIZE,
    MAX_RECORD_BYTES,
    load_tokenizer,
    prepare_dataset,
)
from ringtrain.data.row_view import format_row, row_view
from ringtrain.data.stats import dataset_statistics, format_statistics
from ringtrain.generate.defaults import (
    BUDGET_FRACTION,
    CPU_MAX_TOKENS,
    GPU_BATCH_SIZE,
    GPU_MAX_TOKENS,
    REGENERATE_CPU_BATCH_SIZE,
)
from ringtrain.interrupts import (
    report_stop,
    report_unfinished,
    sigterm_taken_as_ctrl_c,
    stop_name,
)
from ringtrain.process_end import process_entry

if TYPE_CHECKING:
    from ringtrain.data.regen_local import LocalEngine

PREPARE_HELP = """\
Tokenize chat JSONL with the target's tokenizer and chat template into an Arrow dataset.
Each line: {"messages": [{"role": ..., "content": ...}, ...]} or {"conversations": [...]}
(role/content, or ShareGPT from/value). The loss mask marks the assistant turns.
DFlash trains the drafter on the TARGET's own outputs: regenerate the assistant
responses with the target model (its chat template, your serving sampling settings)
before preparing; answers written by another model lower the acceptance length.
--mixture FILE.toml mixes several chat JSONL files by weight or exact row count
([[sources]] with path and weight or rows; see docs/general-data.md) into
<output>/mixture.jsonl, prepares it and reports the rows per source; each row keeps its
source (inspect counts them)."""

REGENERATE_HELP = """\
Answer every assistant turn of chat JSONL again with the target, served by vLLM or SGLang
(any OpenAI chat-completions server; several --server URLs share the load), or offline
with --local MODEL_DIR: transformers in this process on the CPU or one GPU, greedy, up to
--batch-size answers at once (fewer when memory is short), a prompt whose length plus
--max-tokens exceeds the model's context listed as failed (small models; the server
options do not apply). Each turn is regenerated given the conversation before it, whose
earlier assistant turns are the regenerated ones; a conversation ending with a user turn
gets one new assistant turn.
The output is appended record by record; rerunning the same command continues it.
Records that fail are listed in <output>.errors.jsonl. With --local, the first Ctrl-C
lets the answers in flight finish and writes their records; a second one aborts.
Exit status: 0 all done,
1 done but some records failed, 2 bad arguments or files, 3 the server stopped answering,
130 interrupted."""
SERVER_MAX_TOKENS = 4096


def _add_regenerate_parser(commands: argparse._SubParsersAction) -> None:
    regenerate = commands.add_parser(
        "regenerate",
        help="answer chat JSONL again with the target behind vLLM/SGLang",
        description=REGENERATE_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add = regenerate.add_argument
    engine = regenerate.add_mutually_exclusive_group(required=True)
    engine.add_argument(
        "--server", action="append", help="OpenAI base URL, http://HOST:PORT/v1 (repeatable)"
    )
    engine.add_argument(
        "--local", type=Path, metavar="MODEL_DIR", help="generate here with this HF model dir"
    )
    add("--model", help="--server: model name as the server lists it")
    add("--input", required=True, type=Path, help="chat JSONL file")
    add("--output", required=True, type=Path, help="regenerated JSONL (continued if present)")
    add("--resume", action="store_true", help="continue --output; an error if it is missing")
    add("--concurrency", type=int, default=64, help="conversations in flight (default 64)")
    add(
        "--max-tokens",
        type=int,
        help=f"per answer (default {SERVER_MAX_TOKENS}; --local: {GPU_MAX_TOKENS} on GPU, "
        f"{CPU_MAX_TOKENS} on CPU, at most half the model's context)",
    )
    add("--temperature", type=float, default=0.0, help="sampling temperature (default 0: greedy)")
    add("--top-p", type=float, default=1.0, help="sampling's nucleus (default 1: all tokens)")
    add(
        "--chat-template-kwargs",
        type=json_object,
        default=None,
        help="JSON object for the chat template, e.g. '{\"enable_thinking\": false}'",
    )
    add("--timeout", type=float, default=1800.0, help="seconds per request (default 1800)")
    add("--api-key", default=os.environ.get("OPENAI_API_KEY"), help="default: $OPENAI_API_KEY")
    add("--retries", type=int, default=6, help="retries per request, with backoff (default 6)")
    add(
        "--max-failures",
        type=int,
        default=32,
        help="stop after this many failed records in a row (default 32)",
    )
    add("--no-progress", action="store_true", help="no progress bar")
    _add_local_options(regenerate)


def _add_local_options(regenerate: argparse.ArgumentParser) -> None:
    """The options of `regenerate --local` alone."""
    add = regenerate.add_argument
    add("--device", choices=["auto", "cpu", "cuda"], help="--local: default auto (GPU if any)")
    add(
        "--dtype",
        choices=["auto", "bfloat16", "float32"],
        help="--local: default auto (bfloat16 on GPU, float32 on CPU)",
    )
    add(
        "--batch-size",
        type=whole(1),
        help=f"--local: answers at once (default {GPU_BATCH_SIZE} on GPU, "
        f"{REGENERATE_CPU_BATCH_SIZE} on CPU; fewer when memory is short)",
    )
    add(
        "--memory-limit",
        metavar="SIZE",
        help="--local: memory generation may use beside the model, e.g. 4GiB (default: "
        f"{round(100 * BUDGET_FRACTION)}%% of what is free when it starts)",
    )
    add(
        "--threads",
        type=whole(1),
        help="--local: CPU threads (default: the cores other processes leave idle, at least 1)",
    )
    add(
        "--seed",
        type=int,
        help="--local with a --temperature above 0: the sampling generator's seed (default 0)",
    )


LOCAL_ONLY = ("device", "dtype", "batch_size", "memory_limit", "threads", "seed")


def _engine_arguments(args: argparse.Namespace) -> None:
    """Refuse options that do not apply to the engine chosen; raises DatasetError."""
    if args.local is not None:
        if args.model is not None:
            raise DatasetError("--model names a served model; with --local, leave it out")
        return
    if args.model is None:
        raise DatasetError("--server needs --model, the model name as the server lists it")
    given = [
        f"--{name.replace('_', '-')}" for name in LOCAL_ONLY if getattr(args, name) is not None
    ]
    if given:
        verb = "applies" if len(given) == 1 else "apply"
        raise DatasetError(f"{', '.join(given)} {verb} to --local only, not to --server")


def _local_engine(args: argparse.Namespace) -> LocalEngine:
    """The local model's settings (the device's defaults are filled in by `regenerate`)."""
    from ringtrain.data.regen_local import LocalEngine
    from ringtrain.generate.memory import parse_size

    limit = None
    if args.memory_limit is not None:
        try:
            limit = parse_size(args.memory_limit)
        except ValueError as exc:
            raise DatasetError(f"--memory-limit: {exc}") from None
    return LocalEngine(
        args.local.expanduser(),
        args.device or "auto",
        args.dtype or "auto",
        args.batch_size or 0,
        limit,
        args.threads or 0,
        args.seed or 0,
    )


def _regenerate(args: argparse.Namespace) -> int:
    try:
        from ringtrain.data.regen_client import RetryPolicy, Sampling
        from ringtrain.data.regenerate import (
            RegenerateOptions,
            ServerGone,
            regenerate,
            summary,
        )
    except ImportError as exc:
        raise DatasetError(
            f"regenerate needs {exc.name}: pip install 'ringtrain[regenerate]'"
        ) from None
    _engine_arguments(args)
    local = _local_engine(args) if args.local is not None else None
    model = str(args.local.expanduser().resolve()) if local else args.model
    max_tokens = args.max_tokens or (None if local else SERVER_MAX_TOKENS)
    options = RegenerateOptions(
        servers=args.server or [],
        sampling=Sampling(
            model, max_tokens, args.temperature, args.chat_template_kwargs, args.top_p
        ),
        input=args.input,
        output=args.output,
        concurrency=args.concurrency,
        timeout_s=args.timeout,
        api_key=args.api_key,
        retry=RetryPolicy(retries=args.retries),
        max_failures=args.max_failures,
        resume=args.resume,
        local=local,
    )
    try:
        totals = regenerate(options, progress=None if args.no_progress else sys.stderr)
    except ServerGone as exc:
        print(f"ringtrain-data: error: {exc}", file=sys.stderr)
        return 3
    except KeyboardInterrupt as stop:
        return report_stop(stop_name(stop), "records", args.output)
    print(summary(options, totals))
    if totals.stopped_by:
        return report_stop(totals.stopped_by, "records", args.output)
    return 1 if totals.failed else 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ringtrain-data", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    add_synthesize_parser(commands)
    _add_regenerate_parser(commands)
    prepare = commands.add_parser(
        "prepare",
        help="chat JSONL -> Arrow dataset",
        description=PREPARE_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    prepare.add_argument("--tokenizer", required=True, help="local target model/tokenizer dir")
    inputs = prepare.add_mutually_exclusive_group(required=True)
    inputs.add_argument("--input", help="chat JSONL file")
    inputs.add_argument("--mixture", help="TOML file of [[sources]] to mix (path, weight or rows)")
    prepare.add_argument("--output", required=True, help="new dataset directory")
    prepare.add_argument("--max-len", type=int, default=None, help="truncate rows to N tokens")
    prepare.add_argument(
        "--workers",
        type=whole(1),
        default=len(os.sched_getaffinity(0)),
        help="processes (default: one per core this process may use)",
    )
    prepare.add_argument(
        "--max-record-bytes",
        type=int,
        default=MAX_RECORD_BYTES,
        help=f"reject input lines longer than this, unread (default {MAX_RECORD_BYTES >> 20} MiB)",
    )
    _add_block_size_option(prepare)
    _add_inspect_parser(commands)
    add_overlap_parser(commands)
    return parser


def _add_block_size_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--block-size",
        type=whole(1),
        default=DEFAULT_BLOCK_SIZE,
        help="the drafter's block size: rows with fewer than 2 x B supervised tokens are "
        f"counted as dropped by training (default {DEFAULT_BLOCK_SIZE})",
    )


def _add_inspect_parser(commands: argparse._SubParsersAction) -> None:
    inspect = commands.add_parser("inspect", help="validate a dataset and print statistics")
    inspect.add_argument("path", help="dataset directory or file")
    inspect.add_argument("--vocab-size", type=int, default=None, help="check token ids < V")
    _add_block_size_option(inspect)
    inspect.add_argument(
        "--row",
        type=int,
        default=None,
        metavar="N",
        help="instead of statistics, print row N (0-based) decoded with --tokenizer, its "
        "supervised tokens (loss_mask = 1, what the drafter learns) wrapped in ⟦ ⟧",
    )
    inspect.add_argument("--tokenizer", help="local target model/tokenizer dir (for --row)")
    inspect.add_argument("--json", action="store_true", help="print one JSON object")


def _prepare(args: argparse.Namespace) -> None:
    options = {
        "max_len": args.max_len,
        "workers": args.workers,
        "max_record_bytes": args.max_record_bytes,
        "block_size": args.block_size,
        "progress": sys.stderr,  # the stream in use now, not the one of import time
    }
    if args.mixture is not None:
        from ringtrain.data.mixture import prepare_mixture

        report = prepare_mixture(args.mixture, args.tokenizer, args.output, **options)
        totals = report.totals
        for drawn in report.drawn:
            repeated = " (repeated)" if drawn.drawn > drawn.available else ""
            print(
                f"source {drawn.source.name}: {drawn.drawn} records drawn of "
                f"{drawn.available}{repeated} in {drawn.source.path}, "
                f"{report.rows.get(drawn.source.name, 0)} rows"
            )
    else:
        totals = prepare_dataset(args.tokenizer, args.input, args.output, **options)
    print(
        f"{args.output}: {totals.samples} samples, {totals.tokens} tokens, "
        f"{totals.supervised_tokens} supervised tokens; dropped {totals.dropped} "
        f"without assistant tokens and {totals.too_large} over --max-record-bytes, "
        f"truncated {totals.truncated} (of {totals.conversations} conversations)"
    )
    print(
        f"{totals.too_few_supervised} of {totals.samples} rows have fewer than "
        f"{2 * args.block_size} supervised tokens (2 x block size {args.block_size}): "
        "training will drop them"
    )


def _inspect(args: argparse.Namespace) -> None:
    if args.row is None:
        stats = dataset_statistics(
            args.path, vocab_size=args.vocab_size, block_size=args.block_size
        )
        print(json.dumps(stats) if args.json else format_statistics(stats))
        return
    if args.tokenizer is None:
        raise DatasetError("inspect --row needs --tokenizer DIR (the target's) to decode the row")
    view = row_view(args.path, args.row, load_tokenizer(args.tokenizer))
    print(json.dumps(view, ensure_ascii=False) if args.json else format_row(view, args.block_size))


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status (2 on a bad dataset or input; regenerate's
    other statuses are in its help)."""
    args = _parser().parse_args(argv)
    with sigterm_taken_as_ctrl_c():
        try:
            return _run(args)
        except DatasetError as exc:
            print(f"ringtrain-data: error: {exc}", file=sys.stderr)
            return 2
        except KeyboardInterrupt as stop:  # the commands whose output is all or nothing
            return report_unfinished(f"ringtrain-data: {args.command}", stop)


def _run(args: argparse.Namespace) -> int:
    """The parsed command run; its exit status."""
    if args.command == "synthesize":
        return run_synthesize(args)
    if args.command == "overlap":
        return run_overlap(args)
    if args.command == "regenerate":
        return _regenerate(args)
    if args.command == "prepare":
        _prepare(args)
    else:
        _inspect(args)
    return 0


# The console script's entry point (pyproject.toml) and python -m's.
run = process_entry(main)

if __name__ == "__main__":
    run()
