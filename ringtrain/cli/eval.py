"""ringtrain-eval: speculative decoding with a trained DFlash drafter, measured as served.

    ringtrain-eval --target models/toy --drafter runs/toy --prompts data/eval-prompts.jsonl
    ringtrain-eval --target models/Qwen3-8B --drafter runs/qwen3-8b-dflash \\
        --benchmark humaneval --benchmark mt-bench --benchmark gsm8k.jsonl \\
        --chat-template-kwargs '{"enable_thinking": false}'
    ringtrain-eval --target models/SmolLM2 --drafter runs/smollm2 --benchmark mt-bench \\
        --temperature 0 --temperature 1 --seed 0

Prompts are evaluated as served: chat prompts (``messages``, ``turns``, ``question``,
and ``prompt`` text on a target with a chat template unless --raw-prompts) are rendered
with the target's chat template; every user turn of a multi-turn prompt is answered in
order (ringtrain.generate.prompt_sets, ringtrain.eval.runner). Every assistant turn is
decoded twice: by the target alone (the reference and the baseline of speed) and
speculatively (the drafter proposes a block, the target verifies it in one forward).
Reports tau_real (tokens per target verification forward, bonus included), acceptance
per block position and tokens/s of both, overall, per set of prompts and per category
(MT-Bench's writing, math, ...).

Greedy (--temperature 0, the default), both outputs must be identical token for token.
In float32 any difference is an error (exit status 1). In bf16/fp16 a difference where
the target's two candidate tokens tie within rounding (float32 margin within --tie-ulps
units in the last place of the top logit, or speculative decoding committing the float32
argmax where greedy's own rounding did not; ringtrain.eval.ties) is a numerical tie:
counted and reported, and decoding continues from the greedy token; any other difference
is an error naming the prompt, the position, the margin and the float32 argmax. At a
temperature the drafter draws its blocks and the target keeps them by the speculative
sampling rule (ringtrain.eval.sampling), which leaves its output distribution unchanged;
there is no output to compare token for token. Several --temperature values are decoded
in one run (the models load once) with a report for each. With --json the last stdout
line is one JSON object with every metric; with several temperatures, {"evaluations":
[...]}, one such object per temperature in the order given.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, NoReturn

from ringtrain.cli.arg_types import json_object, non_negative, whole
from ringtrain.eval.processes import WorkerDied
from ringtrain.eval.settings import DEFAULT_TIE_ULPS, VERIFY_MODES, SamplingSettings
from ringtrain.eval.stop import EvalStopped
from ringtrain.generate.prompt_sets import BUILTIN_BENCHMARKS
from ringtrain.generate.prompts import PromptFileError
from ringtrain.process_end import process_entry

if TYPE_CHECKING:
    from ringtrain.eval.metrics import EvalReport


class _Parser(argparse.ArgumentParser):
    """An argument parser whose refusals are one line (and exit status 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


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
        "(repeatable); the report has figures per benchmark and per category",
    )
    prompts.add_argument(
        "--limit",
        type=whole(0),
        default=0,
        help="evaluate N prompts of each set only: the first N (MT-Bench: spread over its "
        "8 categories, the first of each in turn)",
    )
    prompts.add_argument(
        "--chat-template-kwargs",
        type=json_object,
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


def _add_sampling_options(parser: argparse.ArgumentParser) -> None:
    sampling = parser.add_argument_group("sampling")
    sampling.add_argument(
        "--temperature",
        type=non_negative,
        action="append",
        help="0 (the default): greedy, checked token for token against the target's greedy "
        "output; above 0: the drafter draws its blocks and the target keeps them by the "
        "speculative sampling rule, both at this temperature. Repeatable: every prompt is "
        "decoded at each, with a report for each",
    )
    sampling.add_argument(
        "--top-p",
        type=float,
        default=1.0,
        help="with --temperature: draw from the smallest set of most likely tokens whose "
        "probability reaches P (target and drafter alike)",
    )
    sampling.add_argument(
        "--seed",
        type=int,
        default=0,
        help="with --temperature: seeds every turn's draws (with the turn's prompt)",
    )


def _add_decoding_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-new-tokens", type=whole(1), default=128, help="per assistant turn")
    parser.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    parser.add_argument("--dtype", default="auto", help="auto (bf16 on CUDA, fp32 on CPU), ...")
    parser.add_argument(
        "--mode",
        default="auto",
        choices=VERIFY_MODES,
        help="own: ringtrain's cache, verification and the greedy reference replayed as CUDA "
        "graphs (attention-only targets; the default for them); cache: transformers' cache "
        "cut back after each block, the reference independent of ringtrain's cache; "
        "recompute: the whole sequence each block (any target; the default for hybrids)",
    )
    parser.add_argument(
        "--tie-ulps",
        type=non_negative,
        default=DEFAULT_TIE_ULPS,
        help="bf16/fp16 only: the largest float32 margin, in units in the last place of the "
        "top logit, for which a divergence from greedy is a numerical tie (0: none)",
    )
    parser.add_argument(
        "--threads",
        type=whole(1),
        help="CPU threads per process (default: torch's own choice; with --workers, the "
        "CPUs shared out: more threads than cores slowed 12 workers several times over)",
    )
    parser.add_argument(
        "--workers",
        type=whole(1),
        default=1,
        help="processes that decode the prompts, each taking the next conversation when "
        "it finished one, all on the same device: one small target decodes one token at a "
        "time and leaves a GPU mostly idle (figures per prompt are unchanged; every "
        "process loads the models)",
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The parsed arguments, every value checked (exit status 2 and one line otherwise);
    ``samplings``: for each --temperature in order, its SamplingSettings (None: 0,
    greedy)."""
    parser = _Parser(prog="ringtrain-eval", description=__doc__.split("\n\n")[0].split(": ", 1)[1])
    parser.add_argument("--target", required=True, help="local Hugging Face target directory")
    parser.add_argument(
        "--drafter", required=True, help="drafter checkpoint, checkpoints root or run directory"
    )
    _add_prompt_options(parser)
    _add_sampling_options(parser)
    _add_decoding_options(parser)
    parser.add_argument("--json", action="store_true", help="print a JSON summary as last line")
    args = parser.parse_args(argv)
    if not args.prompts and not args.benchmark:
        parser.error("give --prompts FILE and/or --benchmark NAME (e.g. --benchmark humaneval)")
    temperatures = args.temperature or [0.0]
    repeated = sorted({t for t in temperatures if temperatures.count(t) > 1})
    if repeated:
        parser.error(f"--temperature {repeated[0]:g} is given more than once")
    try:
        args.samplings = [
            SamplingSettings(t, args.top_p, args.seed) if t > 0 else None for t in temperatures
        ]
    except ValueError as exc:
        parser.error(str(exc))
    if args.top_p != 1.0 and all(t == 0 for t in temperatures):
        parser.error("--top-p applies when sampling: give --temperature above 0 with it")
    return args


def mismatch_error(report: EvalReport) -> str:
    """The error for real divergences: each prompt, position, tokens and float32 margin."""
    lines = [
        f"ringtrain-eval: ERROR: speculative output differs from greedy on "
        f"{len(report.mismatches)} of {report.prompts} prompts beyond rounding "
        f"({report.tie_rule}); "
        "greedy speculative decoding must be lossless:"
    ]
    for m in report.mismatches[:5]:
        margin = "unmeasured" if m["margin"] is None else f"{m['margin']:.4g}"
        exact = "" if m["exact"] is None else f", float32 argmax {m['exact']}"
        lines.append(
            f"  {m['where']}, position {m['position']}: speculative {m['speculative']} "
            f"vs greedy {m['greedy']}, float32 margin {margin}{exact}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # The model libraries load only now: --help and refused arguments answer without them.
    from ringtrain.eval.evaluation import evaluate

    try:
        reports = evaluate(args)
    except (PromptFileError, OSError, ValueError) as exc:
        print(f"ringtrain-eval: {exc}", file=sys.stderr)
        return 2
    except WorkerDied as exc:
        print(f"ringtrain-eval: {exc}", file=sys.stderr)
        return exc.code
    except EvalStopped as stop:
        print(f"ringtrain-eval: {stop.describe()}", file=sys.stderr)
        return stop.code
    print("\n\n".join(report.table() for report in reports))
    for report in reports:
        if report.lossless is False:
            print(mismatch_error(report), file=sys.stderr)
    if args.json:
        results = [report.as_dict() for report in reports]
        print(json.dumps(results[0] if len(results) == 1 else {"evaluations": results}))
    return 1 if any(report.lossless is False for report in reports) else 0


# The console script's entry point (pyproject.toml) and python -m's.
run = process_entry(main)

if __name__ == "__main__":
    run()
