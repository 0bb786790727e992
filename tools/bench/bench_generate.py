"""Batched greedy generation speed (ringtrain.generate.greedy), one row per variant, as JSON.

    python -m tools.bench.bench_generate --device cuda --prompts 4096 --max-new-tokens 128 \\
        --variants own:2048,own-matmul:2048,own-eager:2048,static:2048 --profile static:512

A variant is ``own[-matmul][-eager]:BATCH`` (ringtrain.generate.batch_decode: SDPA or matmul
one-token kernel, CUDA graphs unless ``-eager``) or ``static|dynamic[-sdpa][-compiled]:BATCH``
(transformers' generate with that cache; ``-sdpa``: the model's own attention instead of
the grouped one-token attention), with ``:TOKENS`` after it to bound a batch's padded
tokens (rows x (longest prompt + new tokens)) at TOKENS instead of 2^19
(``own:4096:1048576``). ``agree`` is the share of answers equal to the first variant's.
``--profile VARIANT`` prints the CUDA kernels of 16 new tokens of one batch. The model is
a local Hugging Face directory (``--target``) or, by default, random weights in
SmolLM2-135M's shape (llama, 30 layers, hidden 576): speed does not depend on the
weights, and without stop tokens every prompt is decoded to ``--max-new-tokens``. Prompt
lengths are drawn uniformly from ``--prompt-lengths LO:HI`` with a fixed seed. Prints one
JSON object per variant and a table last.
"""

from __future__ import annotations

import argparse
import json
import random

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from ringtrain.generate.greedy import MAX_BATCH_TOKENS, DecodeOptions, greedy_answers
from ringtrain.generate.model import load_causal_lm

SMOLLM2_135M = {
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "vocab_size": 49152,
    "max_position_embeddings": 8192,
    "rope_theta": 100000.0,
    "tie_word_embeddings": True,
    "rms_norm_eps": 1e-5,
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", help="local Hugging Face model directory (default: random)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--prompts", type=int, default=4096)
    parser.add_argument("--prompt-lengths", default="64:512", metavar="LO:HI")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--variants", default="static:2048,static-compiled:2048,dynamic:1024")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", default="", metavar="VARIANT", help="profile one batch")
    return parser.parse_args(argv)


def make_model(args: argparse.Namespace) -> torch.nn.Module:
    """The model to generate with: ``--target`` or random weights in SmolLM2-135M's shape."""
    if args.target:
        return load_causal_lm(args.target, args.device, args.dtype)
    torch.manual_seed(args.seed)
    config = LlamaConfig(**SMOLLM2_135M)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, args.dtype))
    return model.to(args.device).eval().requires_grad_(False)


def parse_variant(variant: str) -> tuple[DecodeOptions, int, int]:
    """The decode options, batch size and padded tokens per batch a variant names (see
    the module docstring)."""
    kind, batch, *tokens = variant.split(":")
    cache, *flags = kind.split("-")
    options = DecodeOptions(
        cache=cache,
        kernel="matmul" if "matmul" in flags else "sdpa",
        graph="eager" not in flags,
        grouped_attention="sdpa" not in flags,
        compile="compiled" in flags,
    )
    return options, int(batch), int(tokens[0]) if tokens else MAX_BATCH_TOKENS


def profile(model: torch.nn.Module, prompts: list[list[int]], variant: str) -> str:
    """The table of the CUDA kernels (by total time) of 16 new tokens of one batch."""
    options, batch, tokens = parse_variant(variant)
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        greedy_answers(
            model, prompts[:batch], 16, [], pad_id=0, batch_size=batch,
            max_batch_tokens=tokens, options=options,
        )  # fmt: skip
    return prof.key_averages().table(sort_by="cuda_time_total", row_limit=20)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    model = make_model(args)
    lo, hi = (int(x) for x in args.prompt_lengths.split(":"))
    rng = random.Random(args.seed)
    vocab = int(model.config.vocab_size)
    prompts = [
        [rng.randrange(vocab) for _ in range(rng.randint(lo, hi))] for _ in range(args.prompts)
    ]
    rows, first = [], None
    for variant in args.variants.split(","):
        options, batch, tokens = parse_variant(variant)
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        answers, stats = greedy_answers(
            model, prompts, args.max_new_tokens, [], pad_id=0, batch_size=batch,
            max_batch_tokens=tokens, options=options,
        )  # fmt: skip
        first = first or answers
        row = {
            "variant": variant,
            "prompts": stats.prompts,
            "new_tokens": stats.new_tokens,
            "seconds": round(stats.seconds, 2),
            "batches": stats.batches,
            "tokens_per_s": round(stats.tokens_per_s),
            "agree": round(
                sum(a == b for a, b in zip(answers, first, strict=True)) / len(first), 3
            ),
            "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1)
            if torch.cuda.is_available()
            else None,
        }
        print(json.dumps(row), flush=True)
        rows.append(row)
    if args.profile:
        print(profile(model, prompts, args.profile), flush=True)
    print(f"{'variant':<24} {'tokens/s':>10} {'seconds':>8} {'agree':>6}")
    for row in rows:
        print(
            f"{row['variant']:<24} {row['tokens_per_s']:>10} {row['seconds']:>8} {row['agree']:>6}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
