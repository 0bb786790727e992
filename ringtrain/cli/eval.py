"""ringtrain-eval: greedy speculative decoding with a trained DFlash drafter.

    ringtrain-eval --target models/toy --drafter runs/toy --prompts data/eval-prompts.jsonl
    ringtrain-eval --target models/Qwen3-8B --drafter runs/qwen3-8b-dflash \\
        --benchmark humaneval --benchmark gsm8k.jsonl \\
        --chat-template-kwargs '{"enable_thinking": false}'

Prompts are evaluated as served: chat prompts (``messages``, ``turns``, ``question``,
and ``prompt`` text on a target with a chat template unless --raw-prompts) are rendered
with the target's chat template; every user turn of a multi-turn prompt is answered in
order (ringtrain.generate.prompt_sets, ringtrain.eval.runner). Every assistant turn is
decoded twice: plain greedy (the reference) and speculatively (the drafter proposes a
block, the target verifies it in one forward). Reports tau_real (tokens per target
verification forward, bonus included), acceptance per block position and tokens/s of
both, overall and per set of prompts, and checks that both outputs are identical token
for token. In float32 any difference is an error (exit status 1). In bf16/fp16 a
difference where the target's two candidate tokens tie within rounding (float32 margin
within --tie-ulps units in the last place of the top logit; ringtrain.eval.ties) is a
numerical tie: counted and reported, and decoding continues from the greedy token; any
other difference is an error naming the prompt, the position and the margin. With
--json the last stdout line is one JSON object with every metric.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import torch
from transformers import AutoTokenizer

from ringtrain.eval import EvalReport, load_verifying_target, summarize
from ringtrain.eval.dflash import load_dflash_drafter, read_drafter_spec
from ringtrain.eval.runner import TurnDecoder, decode_sets
from ringtrain.eval.ties import DEFAULT_TIE_ULPS, TieJudge
from ringtrain.generate.chat import ChatRenderer
from ringtrain.generate.model import stop_token_ids
from ringtrain.generate.prompt_sets import (
    BUILTIN_BENCHMARKS,
    PromptOptions,
    first_prompt,
    load_prompt_sets,
)
from ringtrain.generate.prompts import PromptFileError


def _json_object(text: str) -> dict:
    """argparse type of --chat-template-kwargs: a JSON object."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON ({exc}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(
            f"must be a JSON object such as '{{\"enable_thinking\": false}}', got {text!r}"
        )
    return value


def _add_prompt_options(parser: argparse.ArgumentParser) -> None:
    prompts = parser.add_argument_group("prompts")
    prompts.add_argument(
        "--prompts",
        action="append",
        default=[],
        metavar="JSONL",
        help='a prompts file (repeatable): one object per line with "messages", "turns", '
        '"question", "prompt" (text) or "input_ids"',
    )
    prompts.add_argument(
        "--benchmark",
        action="append",
        default=[],
        metavar="NAME|JSONL",
        help=f"a built-in benchmark ({', '.join(BUILTIN_BENCHMARKS)}) or a prompts file "
        "(repeatable); the report has figures per benchmark",
    )
    prompts.add_argument(
        "--limit", type=int, default=0, help="evaluate the first N prompts of each set only"
    )
    prompts.add_argument(
        "--chat-template-kwargs",
        type=_json_object,
        default={},
        metavar="JSON",
        help="options of the chat template, as the server passes them, e.g. "
        "'{\"enable_thinking\": false}'",
    )
    prompts.add_argument(
        "--system", help="a system message for every conversation that starts without one"
    )
    prompts.add_argument(
        "--raw-prompts",
        action="store_true",
        help='encode "prompt" text without the chat template (on a target that has one)',
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="ringtrain-eval", description=__doc__.split("\n\n")[0].split(": ", 1)[1]
    )
    parser.add_argument("--target", required=True, help="local Hugging Face target directory")
    parser.add_argument(
        "--drafter", required=True, help="drafter checkpoint, checkpoints root or run directory"
    )
    _add_prompt_options(parser)
    parser.add_argument("--max-new-tokens", type=int, default=128, help="per assistant turn")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--dtype", default="auto", help="auto (bf16 on CUDA, fp32 on CPU), ...")
    parser.add_argument(
        "--mode",
        default="auto",
        choices=["auto", "own", "cache", "recompute"],
        help="own: ringtrain's cache, verification and the greedy reference replayed as CUDA "
        "graphs (attention-only targets; the default for them); cache: transformers' cache "
        "cut back after each block, the reference independent of ringtrain's cache; "
        "recompute: the whole sequence each block (any target; the default for hybrids)",
    )
    parser.add_argument(
        "--tie-ulps",
        type=float,
        default=DEFAULT_TIE_ULPS,
        help="bf16/fp16 only: the largest float32 margin, in units in the last place of the "
        "top logit, for which a divergence from greedy is a numerical tie (0: none)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="CPU threads per process (0: torch's default; with --workers, the CPUs shared "
        "out: more threads than cores slowed 12 workers several times over)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="processes that decode a share of the prompts each, all on the same device: "
        "one small target decodes one token at a time and leaves a GPU mostly idle "
        "(figures per prompt are unchanged; every process loads the models)",
    )
    parser.add_argument("--json", action="store_true", help="print a JSON summary as last line")
    args = parser.parse_args(argv)
    if args.limit < 0:
        parser.error(f"--limit must be 0 (all prompts) or more, got {args.limit}")
    if args.workers < 1:
        parser.error(f"--workers must be 1 or more, got {args.workers}")
    if not args.prompts and not args.benchmark:
        parser.error("give --prompts FILE and/or --benchmark NAME (e.g. --benchmark humaneval)")
    return args


def _tokenizer(target: Path):
    if (target / "tokenizer.json").is_file() or (target / "tokenizer_config.json").is_file():
        return AutoTokenizer.from_pretrained(target, local_files_only=True)
    return None


def _device(args: argparse.Namespace) -> torch.device:
    if args.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(args.device)


def _prompt_sets(args: argparse.Namespace) -> tuple[list, ChatRenderer, object]:
    """(prompt sets, renderer, drafter spec); checked before any model loads."""
    spec = read_drafter_spec(args.drafter)
    target_dir = Path(args.target).expanduser()
    renderer = ChatRenderer(_tokenizer(target_dir), args.chat_template_kwargs, args.system)
    # The drafter's vocabulary is the target's (load_dflash_drafter refuses a drafter of
    # another target).
    options = PromptOptions(renderer, spec.vocab_size, args.raw_prompts, args.limit)
    return load_prompt_sets(args.prompts, args.benchmark, options), renderer, spec


def decode_share(
    args: argparse.Namespace, shard: tuple[int, int], prepared: tuple | None = None
) -> tuple[list, str]:
    """Load the models and decode one share of the prompts: (outcomes, tie rule).

    ``prepared``: what ``_prompt_sets`` returned, where this process already read it (a
    worker process reads the prompts itself)."""
    threads = args.threads or (
        max(1, (os.cpu_count() or 1) // args.workers) if args.workers > 1 else 0
    )
    if threads:
        torch.set_num_threads(threads)
    device = _device(args)
    sets, renderer, spec = prepared or _prompt_sets(args)
    first = first_prompt(sets[0].conversations[0], renderer)
    target = load_verifying_target(
        Path(args.target).expanduser(), list(spec.tap_layers), device, args.dtype, args.mode
    )
    # Later turns are longer; the drafter extends its positions when one needs more.
    drafter = load_dflash_drafter(
        args.drafter, target, max_positions=len(first) + args.max_new_tokens
    )
    judge = TieJudge(target.model, args.tie_ulps)
    decoder = TurnDecoder(
        target, drafter, judge, stop_token_ids(target.model.config), args.max_new_tokens
    )
    if shard[0] == 0:
        print(
            f"ringtrain-eval: {sum(s.turns for s in sets)} assistant turns in "
            f"{', '.join(s.name for s in sets)}; block size {spec.block_size}, taps "
            f"{list(spec.tap_layers)}, verification by {target.mode} on {device}"
            f"{f', {shard[1]} processes' if shard[1] > 1 else ''}",
            file=sys.stderr,
        )
    decoder.warm_up(first)
    return decode_sets(sets, decoder, renderer, target.vocab_size, shard), judge.describe()


def evaluate(args: argparse.Namespace) -> dict:
    """Run the evaluation described by the parsed arguments; returns the report dict."""
    prepared = _prompt_sets(args)
    sets, _, spec = prepared
    if args.workers == 1:
        outcomes, tie_rule = decode_share(args, (0, 1), prepared)
    else:
        context = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(args.workers, mp_context=context) as pool:
            shares = [(k, args.workers) for k in range(args.workers)]
            results = list(pool.map(decode_share, [args] * args.workers, shares))
        set_order = {prompt_set.name: k for k, prompt_set in enumerate(sets)}
        outcomes = sorted(
            (o for share, _ in results for o in share),
            key=lambda o: (set_order[o.benchmark], o.index, o.turn),
        )
        tie_rule = results[0][1]
    report = summarize(outcomes, spec.block_size, tie_rule)
    print(report.table())
    if not report.lossless:
        print(mismatch_error(report), file=sys.stderr)
    return report.as_dict()


def mismatch_error(report: EvalReport) -> str:
    """The error for real divergences: each prompt, position, tokens and float32 margin."""
    lines = [
        f"ringtrain-eval: ERROR: speculative output differs from greedy on "
        f"{len(report.mismatches)} of {report.prompts} prompts beyond rounding ({report.tie_rule}); "
        "greedy speculative decoding must be lossless:"
    ]
    for m in report.mismatches[:5]:
        margin = "unmeasured" if m["margin"] is None else f"{m['margin']:.4g}"
        lines.append(
            f"  {m['where']}, position {m['position']}: speculative {m['speculative']} "
            f"vs greedy {m['greedy']}, float32 margin {margin}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        result = evaluate(args)
    except (PromptFileError, FileNotFoundError, ValueError) as exc:
        print(f"ringtrain-eval: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result))
    return 0 if result["lossless"] else 1


if __name__ == "__main__":
    sys.exit(main())
