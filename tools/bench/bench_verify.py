"""Speed of speculative decoding's target forwards, per verification mode, as JSON.

    python -m tools.bench.bench_verify --device cuda --modes own,cache --blocks 200

For each mode of ringtrain.eval.target (``own``: its own cache with the verification
replayed as a CUDA graph; ``cache``: transformers' cache), times a prompt's prefill,
``--blocks`` verifications of a block of ``--block-size`` tokens (each followed by a
rollback that keeps half the block, as acceptance would) and the plain greedy reference
(one token per forward with transformers' cache). The model is random weights in
SmolLM2-135M's shape (tools.bench.bench_generate) or ``--target``; every mode's target
choices are compared with the first mode's (``agree``). Prints one JSON object per mode
and a table last.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from ringtrain.eval.speculative import greedy_generate
from ringtrain.eval.target import VerifyingTarget
from tools.bench.bench_generate import make_model

TAPS = [1, 8, 14, 20, 27]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", help="local Hugging Face model directory (default: random)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--modes", default="own,cache")
    parser.add_argument("--prompt-length", type=int, default=256)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--blocks", type=int, default=200)
    parser.add_argument("--greedy-tokens", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_mode(target: VerifyingTarget, sequence: torch.Tensor, args: argparse.Namespace) -> dict:
    """Prefill, verification and greedy timings of one target; its choices for ``agree``."""
    device = target.device
    block = args.block_size
    features = torch.empty(len(sequence), target.tap_width, dtype=target.dtype, device=device)
    target.reserve(len(sequence))
    sync(device)
    started = time.perf_counter()
    target.prefill(sequence[: args.prompt_length], features[: args.prompt_length])
    sync(device)
    prefill_s = time.perf_counter() - started
    committed, choices, started = args.prompt_length, [], time.perf_counter()
    for _ in range(args.blocks):
        greedy = target.verify(sequence, committed, block, features[committed : committed + block])
        choices.append(greedy)
        committed += block // 2
        target.rollback(committed)
    sync(device)
    verify_s = time.perf_counter() - started
    reference = greedy_generate(target, sequence[: args.prompt_length], args.greedy_tokens)
    return {
        "mode": target.mode,
        "prefill_ms": round(1000 * prefill_s, 2),
        "verify_ms": round(1000 * verify_s / args.blocks, 3),
        "greedy_ms_per_token": round(1000 * reference.seconds / len(reference.tokens), 3),
        "choices": torch.stack(choices).tolist(),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    model = make_model(args)
    generator = torch.Generator().manual_seed(args.seed)
    length = args.prompt_length + args.blocks * args.block_size // 2 + args.block_size
    vocab = int(model.config.vocab_size)
    sequence = torch.randint(vocab, (length,), generator=generator).to(args.device)
    taps = [t for t in TAPS if t < int(model.config.num_hidden_layers)]
    rows, first = [], None
    for mode in args.modes.split(","):
        target = VerifyingTarget(model, taps, mode)
        row = time_mode(target, sequence, args)
        choices = row.pop("choices")
        first = first or choices
        same = sum(
            a == b for x, y in zip(choices, first, strict=True) for a, b in zip(x, y, strict=True)
        )
        row["agree"] = round(same / (len(first) * args.block_size), 4)
        print(json.dumps(row), flush=True)
        rows.append(row)
    print(f"{'mode':<10} {'prefill ms':>10} {'verify ms':>10} {'greedy ms/token':>16} {'agree':>6}")
    for row in rows:
        print(
            f"{row['mode']:<10} {row['prefill_ms']:>10} {row['verify_ms']:>10} "
            f"{row['greedy_ms_per_token']:>16} {row['agree']:>6}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
