"""The GEMM ceiling of a model step: its matmul shapes alone, at cuBLAS's rate on this chip.

Every linear layer of one step is timed as the GEMMs autograd runs for it (forward
x @ W^T; for training also the input gradient dy @ W and the weight gradient dy^T @ x),
each on its own, bf16, back to back. The sum of their times is what the step's GEMMs
cannot go below with these shapes; with the step's model FLOPs it bounds the MFU a step
can reach when everything that is not a GEMM costs nothing. Shape sets:

- ``target``: the Qwen3-8B target's forward over 9,216 tokens (q, k, v, o, gate, up, down
  per layer, 34 of 36 layers: the taps end there);
- ``drafter``: the Qwen3-8B-shaped drafter's training step (5 layers; 24,576 block rows,
  33,792 key/value rows, 9,216 context rows into fc, the frozen LM head over 23,040 rows
  in chunks of 4,096);
- ``drafter_small``: the real-model recipe's drafter (configs/smollm2-135m.toml: 4 layers of
  hidden 576, 9 / 3 heads of 64, MLP 1536, 5 taps; 32 x 512-token documents with 128
  anchors each: 65,536 block rows, 81,920 key/value rows, 16,384 context rows, the frozen
  LM head over 49,152 tokens for 61,440 rows in the recipe's 16,384-row loss chunks);
- ``fused``: the same drafter GEMMs with gate|up and k|v each one GEMM of twice the width,
  to see what fusing them would gain.

    python -m tools.bench.bench_gemm --json
"""

from __future__ import annotations

import argparse

import torch

from tools.bench.bench_report import report_head, save_report
from tools.bench.gpu_timing import PEAK_BF16_FLOPS, gpu_us_per_call, require_cuda
from tools.bench.model_shapes import QWEN3_8B, SMOLLM2_135M

# (name, rows M, in K, out N, count per step, passes): passes "f" forward, "d" input
# gradient, "w" weight gradient.
Gemm = tuple[str, int, int, int, float, str]
TARGET_LAYERS = 34
DRAFTER_LAYERS = 5
BLOCK_ROWS, KV_ROWS, CTX_ROWS, HEAD_ROWS, HEAD_CHUNK = 24576, 33792, 9216, 23040, 4096
DRAFTER_TAPS = 5


def drafter_gemms(
    target: dict[str, int], layers: int, rows: tuple[int, int, int, int], head_chunk: int
) -> list[Gemm]:
    """The GEMMs of one training step of `target`'s drafter (its hidden size, heads, MLP
    width and vocabulary) with `layers` layers; rows: (block, key/value, context, LM-head)
    rows of the step."""
    hidden, mlp = target["hidden_size"], target["intermediate_size"]
    q_out = target["num_attention_heads"] * target["head_dim"]
    kv_out = target["num_key_value_heads"] * target["head_dim"]
    block, kv, ctx, head = rows
    return [
        ("q_proj", block, hidden, q_out, layers, "fdw"),
        ("k_proj", kv, hidden, kv_out, layers, "fdw"),
        ("v_proj", kv, hidden, kv_out, layers, "fdw"),
        ("o_proj", block, q_out, hidden, layers, "fdw"),
        ("gate_proj", block, hidden, mlp, layers, "fdw"),
        ("up_proj", block, hidden, mlp, layers, "fdw"),
        ("down_proj", block, mlp, hidden, layers, "fdw"),
        ("fc", ctx, DRAFTER_TAPS * hidden, hidden, 1, "fw"),
        ("lm_head", head_chunk, hidden, target["vocab_size"], head / head_chunk, "fd"),
    ]


SHAPES: dict[str, list[Gemm]] = {
    "target": [
        ("q_proj", 9216, 4096, 4096, TARGET_LAYERS, "f"),
        ("k_proj", 9216, 4096, 1024, TARGET_LAYERS, "f"),
        ("v_proj", 9216, 4096, 1024, TARGET_LAYERS, "f"),
        ("o_proj", 9216, 4096, 4096, TARGET_LAYERS, "f"),
        ("gate_proj", 9216, 4096, 12288, TARGET_LAYERS, "f"),
        ("up_proj", 9216, 4096, 12288, TARGET_LAYERS, "f"),
        ("down_proj", 9216, 12288, 4096, TARGET_LAYERS, "f"),
    ],
    "drafter": drafter_gemms(
        QWEN3_8B, DRAFTER_LAYERS, (BLOCK_ROWS, KV_ROWS, CTX_ROWS, HEAD_ROWS), HEAD_CHUNK
    ),
    # 32 x 512-token documents, 128 anchors each, blocks of 16, 16,384-row loss chunks.
    "drafter_small": drafter_gemms(SMOLLM2_135M, 4, (65536, 81920, 16384, 61440), 16384),
}
SHAPES["fused"] = [
    s for s in SHAPES["drafter"] if s[0] not in ("k_proj", "v_proj", "gate_proj", "up_proj")
] + [
    ("kv_proj", KV_ROWS, 4096, 2048, DRAFTER_LAYERS, "fdw"),
    ("gate_up_proj", BLOCK_ROWS, 4096, 24576, DRAFTER_LAYERS, "fdw"),
]


def gemm_us(rows: int, k: int, n: int, kind: str, reps: int) -> float:
    """GPU microseconds of one GEMM of a linear layer [rows, k] -> [rows, n]."""
    dev, dt = "cuda", torch.bfloat16
    w = torch.randn(n, k, device=dev, dtype=dt)
    if kind == "f":
        x = torch.randn(rows, k, device=dev, dtype=dt)
        return gpu_us_per_call(lambda _: x @ w.t(), reps)
    dy = torch.randn(rows, n, device=dev, dtype=dt)
    if kind == "d":
        return gpu_us_per_call(lambda _: dy @ w, reps)
    x = torch.randn(rows, k, device=dev, dtype=dt)
    return gpu_us_per_call(lambda _: dy.t() @ x, reps)


def shape_set(name: str, reps: int) -> dict:
    """Per-shape rates and the set's total GEMM time and FLOPs per step."""
    rows_out, total_us, total_flops = [], 0.0, 0.0
    for layer, rows, k, n, count, passes in SHAPES[name]:
        for kind in passes:
            us = gemm_us(rows, k, n, kind, reps)
            flops = 2 * rows * k * n
            total_us += us * count
            total_flops += flops * count
            rows_out.append(
                {"layer": layer, "pass": kind, "m": rows, "k": k, "n": n,
                 "us": us, "tflops": flops / us / 1e6}
            )  # fmt: skip
    rate = total_flops / total_us / 1e6
    return {
        "set": name,
        "gemm_ms_per_step": total_us / 1e3,
        "gemm_tflop_per_step": total_flops / 1e12,
        "gemm_tflops": rate,
        "gemm_fraction_of_peak": rate * 1e12 / PEAK_BF16_FLOPS,
        "shapes": rows_out,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", default=",".join(SHAPES), help="comma list of shape sets")
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    args = parser.parse_args(argv)
    require_cuda("bench_gemm")
    results = [shape_set(name, args.reps) for name in args.sets.split(",")]
    for r in results:
        print(f"== {r['set']}: {r['gemm_ms_per_step']:.1f} ms, {r['gemm_tflops']:.0f} TFLOP/s "
              f"({r['gemm_fraction_of_peak']:.3f} of peak)")  # fmt: skip
        for s in r["shapes"]:
            print(f"   {s['layer']:<13} {s['pass']} {s['m']:>6} x {s['k']:>6} -> {s['n']:>6} "
                  f"{s['us']:>9.1f} us {s['tflops']:>6.0f} TFLOP/s")  # fmt: skip
    report = {
        **report_head("bench_gemm"),
        "results": results,
    }
    save_report(report, "bench_gemm", args.json)
    return report


if __name__ == "__main__":
    main()
