"""ringtrain-eval: greedy speculative decoding with a trained DFlash drafter.

    ringtrain-eval --target models/toy --drafter runs/toy --prompts data/eval-prompts.jsonl

Every prompt is decoded twice: plain greedy (the reference) and speculatively (the
drafter proposes a block, the target verifies it in one forward). Reports tau_real
(tokens per target verification forward, bonus included), acceptance per block
position and tokens/s, and checks that both outputs are identical token for token.
In float32 any difference is an error (exit status 1). In bf16/fp16 a difference where
the target's two candidate tokens tie within rounding (float32 margin within
--tie-ulps units in the last place of the top logit; ringtrain.eval.ties) is a
numerical tie: counted and reported, and decoding continues from the greedy token;
any other difference is an error naming the prompt, the position and the margin.
With --json the last stdout line is one JSON object with every metric.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from transformers import AutoTokenizer

from ringtrain.eval import (
    EvalReport,
    PromptFileError,
    PromptOutcome,
    greedy_generate,
    load_prompts,
    load_verifying_target,
    speculative_generate,
    stop_token_ids,
    summarize,
)
from ringtrain.eval.dflash import load_dflash_drafter, read_drafter_spec
from ringtrain.eval.speculative import GreedyReference
from ringtrain.eval.ties import DEFAULT_TIE_ULPS, TieJudge

WARMUP_TOKENS = 8


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="ringtrain-eval", description=__doc__.split("\n\n")[0].split(": ", 1)[1]
    )
    parser.add_argument("--target", required=True, help="local Hugging Face target directory")
    parser.add_argument(
        "--drafter", required=True, help="drafter checkpoint, checkpoints root or run directory"
    )
    parser.add_argument("--prompts", required=True, help='JSONL: "prompt" text or "input_ids"')
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--limit", type=int, default=0, help="evaluate the first N prompts only")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--dtype", default="auto", help="auto (bf16 on CUDA, fp32 on CPU), ...")
    parser.add_argument(
        "--mode",
        default="auto",
        choices=["auto", "cache", "recompute"],
        help="verification with a KV cache cut back after each block (attention-only "
        "targets) or recomputed over the whole sequence (any target)",
    )
    parser.add_argument(
        "--tie-ulps",
        type=float,
        default=DEFAULT_TIE_ULPS,
        help="bf16/fp16 only: the largest float32 margin, in units in the last place of the "
        "top logit, for which a divergence from greedy is a numerical tie (0: none)",
    )
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's default)")
    parser.add_argument("--json", action="store_true", help="print a JSON summary as last line")
    return parser.parse_args(argv)


def _tokenizer(target: Path):
    if (target / "tokenizer.json").is_file() or (target / "tokenizer_config.json").is_file():
        return AutoTokenizer.from_pretrained(target, local_files_only=True)
    return None


def evaluate(args: argparse.Namespace) -> dict:
    """Run the evaluation described by the parsed arguments; returns the report dict."""
    device = torch.device(
        ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    )
    if args.threads:
        torch.set_num_threads(args.threads)
    target_dir = Path(args.target).expanduser()
    spec = read_drafter_spec(args.drafter)
    target = load_verifying_target(
        target_dir, list(spec.tap_layers), device, dtype=args.dtype, mode=args.mode
    )
    prompts = load_prompts(args.prompts, _tokenizer(target_dir), target.vocab_size)
    if args.limit:
        prompts = prompts[: args.limit]
    longest = max(map(len, prompts)) + args.max_new_tokens
    drafter = load_dflash_drafter(args.drafter, target, max_positions=longest)
    stops = stop_token_ids(target.model.config)
    print(
        f"ringtrain-eval: {len(prompts)} prompts, block size {spec.block_size}, taps "
        f"{list(spec.tap_layers)}, verification by {target.mode} on {device}",
        file=sys.stderr,
    )
    warmup = torch.tensor(prompts[0], dtype=torch.long)
    speculative_generate(target, drafter, warmup, WARMUP_TOKENS, stops)
    greedy_generate(target, warmup, WARMUP_TOKENS, stops)
    judge = TieJudge(target.model, args.tie_ulps)
    outcomes = []
    for index, prompt in enumerate(prompts):
        ids = torch.tensor(prompt, dtype=torch.long)
        greedy = greedy_generate(target, ids, args.max_new_tokens, stops)
        reference = GreedyReference(greedy.tokens, judge)
        speculative = speculative_generate(
            target, drafter, ids, args.max_new_tokens, stops, reference
        )
        outcomes.append(PromptOutcome(index, len(prompt), speculative, greedy))
    report = summarize(outcomes, spec.block_size, judge.describe())
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
            f"  prompt {m['prompt']}, position {m['position']}: speculative {m['speculative']} "
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
