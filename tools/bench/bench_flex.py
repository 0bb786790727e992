"""Benchmark the drafter's attention alone: flex_attention over the anchor blocks' mask.

One layer's attention as the drafter trains it (``--shape qwen3-8b``, the default: 32
query / 8 KV heads of 128, 3 documents of 3072 tokens, 512 anchors each, blocks of 16;
``--shape smollm2-135m``, the real recipe's drafter: 9 / 3 heads of 64, 32 documents of
512 tokens, 128 anchors each, blocks of 16; keys
`[context ; blocks]`, the BlockMask of ringtrain/drafter/masks.py), compiled, forward and
forward + backward, for a list of flex_attention kernel options (tile sizes, stages,
warps; "autotune" lets inductor's max-autotune choose; "gathered" is not flex_attention
but each block's keys gathered and scored by one SDPA call). Beside it, as the reference of
what dense attention reaches on the same chip: causal SDPA (flash) over the shape's
documents with the same heads. FLOPs: 4 x visible (query, key) pairs x head_dim x
query heads forward, 2.5 times that for the backward.

    python -m tools.bench.bench_flex --json
    python -m tools.bench.bench_flex --json --options default,rows_safe,bwd_64x64
    python -m tools.bench.bench_flex --json --shape smollm2-135m
"""

from __future__ import annotations

import argparse
import time
from functools import partial

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import flex_attention

from ringtrain.drafter.arch.dflash.model import _gathered_attend
from ringtrain.drafter.blocks import build_blocks, layout_sizes
from ringtrain.drafter.config import DrafterConfig
from ringtrain.drafter.masks import BlockMaskBuilder
from ringtrain.packed_batch import random_packed_batch
from tools.bench.bench_report import report_head, save_report
from tools.bench.gpu_timing import PEAK_BF16_FLOPS, gpu_us_per_call, require_cuda
from tools.bench.model_shapes import QWEN3_8B, QWEN3_MASK_TOKEN_ID, SMOLLM2_135M


def _bwd(m1: int, n1: int, m2: int, n2: int, stages: int, warps: int) -> dict:
    return {
        "bwd_BLOCK_M1": m1,
        "bwd_BLOCK_N1": n1,
        "bwd_BLOCK_M2": m2,
        "bwd_BLOCK_N2": n2,
        "bwd_num_stages": stages,
        "bwd_num_warps": warps,
    }


# Kernel options per name (flex_attention's kernel_options; "fwd_"/"bwd_" prefixes pick a
# direction). The sm90 default for head_dim 128 is bwd (64, 128, 128, 64), 3 stages, 8 warps.
OPTIONS = {
    "default": {},
    "rows_safe": {"ROWS_GUARANTEED_SAFE": True},
    "tma": {"USE_TMA": True},
    "bwd_64x64": _bwd(64, 64, 64, 64, 3, 4),
    "bwd_32x128": _bwd(32, 128, 128, 32, 3, 4),
    "bwd_64x128_w4": _bwd(64, 128, 128, 64, 3, 4),
    "bwd_64x128_s2": _bwd(64, 128, 128, 64, 2, 8),
    "bwd_128x128": _bwd(128, 128, 128, 128, 2, 8),
    "fwd_128x128": {
        "fwd_BLOCK_M": 128,
        "fwd_BLOCK_N": 128,
        "fwd_num_stages": 2,
        "fwd_num_warps": 8,
    },
    "autotune": {},
}
# Not flex_attention: each block's keys gathered, then dense SDPA (`gathered_variant`).
GATHERED = "gathered"
# Per --shape: the model's heads, then documents, tokens per document, anchors per document.
SHAPES = {
    "qwen3-8b": (QWEN3_8B, 3, 3072, 512),
    "smollm2-135m": (SMOLLM2_135M, 32, 512, 128),
}


def drafter_layout(device: torch.device, docs: int, doc_len: int, anchors: int, block: int):
    """(BlockMask, GatheredMask, query rows, key rows, visible pairs) of one packed batch."""
    cfg = DrafterConfig(
        block_size=block, num_anchors=anchors, anchor_ref_len=doc_len, mask_token_id=0
    )
    max_tokens = docs * doc_len
    rows = random_packed_batch([doc_len] * docs, 1, 1000, device, torch.bfloat16, seed=0)
    ctx_capacity, max_anchors = layout_sizes(cfg, max_tokens)
    generator = torch.Generator(device).manual_seed(0)
    blocks = build_blocks(rows, generator, cfg, QWEN3_MASK_TOKEN_ID, ctx_capacity, max_anchors)
    builder = BlockMaskBuilder(ctx_capacity, max_anchors, block, (0,), device)
    gathered = builder.build(blocks.ctx_lo, blocks.ctx_hi, blocks.anchor, gathered=True)[0]
    mask = builder.build(blocks.ctx_lo, blocks.ctx_hi, blocks.anchor)[0]
    valid = blocks.valid
    visible = int(((blocks.ctx_hi - blocks.ctx_lo)[valid] + block).sum()) * block
    return mask, gathered, max_anchors * block, ctx_capacity + max_anchors * block, visible


def time_attention(attend, q, k, v, reps: int) -> tuple[float, float]:
    """(forward ms, forward + backward ms) of `attend(q, k, v)`."""
    grad = torch.randn_like(q)
    with torch.no_grad():
        fwd = gpu_us_per_call(lambda _: attend(q, k, v), reps) / 1e3

    def step(_: int) -> None:
        attend(q, k, v).backward(grad)

    both = gpu_us_per_call(step, reps) / 1e3
    return fwd, both


def rates(fwd_ms: float, both_ms: float, fwd_flops: float) -> dict:
    """TFLOP/s and MFU of the forward, the backward alone and both."""
    bwd_ms = both_ms - fwd_ms
    return {
        "fwd_ms": fwd_ms,
        "bwd_ms": bwd_ms,
        "fwd_bwd_ms": both_ms,
        "fwd_tflops": fwd_flops / fwd_ms / 1e9,
        "bwd_tflops": 2.5 * fwd_flops / bwd_ms / 1e9,
        "fwd_bwd_mfu": 3.5 * fwd_flops / both_ms / 1e-3 / PEAK_BF16_FLOPS,
    }


def flex_variant(name: str, mask, q, k, v, scale: float, reps: int, fwd_flops: float) -> dict:
    """One kernel-option set, compiled on its own."""
    torch._dynamo.reset()
    mode = "max-autotune-no-cudagraphs" if name == "autotune" else "default"
    attend = torch.compile(
        partial(
            flex_attention,
            block_mask=mask,
            scale=scale,
            enable_gqa=True,
            kernel_options=OPTIONS[name] or None,
        ),
        mode=mode,
        dynamic=False,
    )
    return compiled_result(name, attend, q, k, v, reps, fwd_flops)


def gathered_variant(mask, q, k, v, scale: float, reps: int, fwd_flops: float) -> dict:
    """Each block's keys gathered and scored by one SDPA call (the eager drafter's
    attention, ringtrain/drafter/arch/dflash/model.py), compiled."""
    torch._dynamo.reset()
    attend = torch.compile(partial(_gathered_attend, mask=mask, scale=scale), dynamic=False)
    return compiled_result(GATHERED, attend, q, k, v, reps, fwd_flops)


def compiled_result(name: str, attend, q, k, v, reps: int, fwd_flops: float) -> dict:
    """A compiled attention's first call (its compilation) timed, then its rates."""
    began = time.perf_counter()
    attend(q, k, v).sum().backward()
    torch.cuda.synchronize()
    compile_s = time.perf_counter() - began
    return {
        "options": name,
        "compile_s": compile_s,
        **rates(*time_attention(attend, q, k, v, reps), fwd_flops),
    }


def dense_reference(
    heads: int, kv_heads: int, head_dim: int, docs: int, doc_len: int, reps: int
) -> dict:
    """Causal flash SDPA over `docs` documents of `doc_len` tokens (one batch row each)."""
    shape = (docs, heads, doc_len, head_dim)
    q = torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    kv = (docs, kv_heads, doc_len, head_dim)
    k = torch.randn(kv, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(kv, device="cuda", dtype=torch.bfloat16, requires_grad=True)

    def attend(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)

    visible = docs * doc_len * (doc_len + 1) // 2
    fwd_flops = 4 * visible * head_dim * heads
    return {
        "options": "dense_causal_sdpa",
        **rates(*time_attention(attend, q, k, v, reps), fwd_flops),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--options", default=",".join(OPTIONS), help=f"comma list of names (and {GATHERED!r})"
    )
    parser.add_argument("--shape", default="qwen3-8b", choices=sorted(SHAPES))
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument(
        "--token-major",
        action="store_true",
        help="queries, keys and values as the drafter passes them: head-major views of "
        "token-major [rows, heads, dim] tensors (default: contiguous head-major tensors)",
    )
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    return parser.parse_args(argv)


def attention_input(
    heads: int, rows: int, head_dim: int, device: torch.device, token_major: bool
) -> torch.Tensor:
    """A [1, heads, rows, head_dim] bf16 input that gradients reach: contiguous, or with
    ``token_major`` a view of a [rows, heads, head_dim] tensor (the drafter's layout)."""
    if token_major:
        x = torch.randn(rows, heads, head_dim, device=device, dtype=torch.bfloat16)
        return x.requires_grad_().transpose(0, 1).unsqueeze(0)
    x = torch.randn(1, heads, rows, head_dim, device=device, dtype=torch.bfloat16)
    return x.requires_grad_()


def print_table(results: list[dict]) -> None:
    print(f"{'options':<18} {'fwd ms':>7} {'bwd ms':>7} {'fwd TF/s':>9} {'bwd TF/s':>9} {'mfu':>6}")
    for r in results:
        if "error" in r:
            print(f"{r['options']:<18} {r['error'][:90]}")
            continue
        print(f"{r['options']:<18} {r['fwd_ms']:>7.2f} {r['bwd_ms']:>7.2f} "
              f"{r['fwd_tflops']:>9.0f} {r['bwd_tflops']:>9.0f} "
              f"{r['fwd_bwd_mfu']:>6.3f}")  # fmt: skip


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    require_cuda("bench_flex")
    device = torch.device("cuda")
    model, docs, doc_len, anchors = SHAPES[args.shape]
    heads, kv_heads, head_dim = (
        model[k] for k in ("num_attention_heads", "num_key_value_heads", "head_dim")
    )
    mask, gathered, q_len, kv_len, visible = drafter_layout(
        device, docs, doc_len, anchors, block=16
    )
    fwd_flops = 4 * visible * head_dim * heads
    q, k, v = (
        attention_input(h, n, head_dim, device, args.token_major)
        for h, n in ((heads, q_len), (kv_heads, kv_len), (kv_heads, kv_len))
    )
    results = [dense_reference(heads, kv_heads, head_dim, docs, doc_len, args.reps)]
    for name in args.options.split(","):
        print(f"[bench_flex] {name}", flush=True)
        try:
            if name == GATHERED:
                results.append(
                    gathered_variant(gathered, q, k, v, head_dim**-0.5, args.reps, fwd_flops)
                )
            else:
                results.append(
                    flex_variant(name, mask, q, k, v, head_dim**-0.5, args.reps, fwd_flops)
                )
        except Exception as exc:  # report and go on with the next option set
            results.append({"options": name, "error": f"{type(exc).__name__}: {exc}"[:400]})
    print_table(results)
    report = {
        **report_head("bench_flex", device),
        "shape": args.shape,
        "token_major": args.token_major,
        "q_rows": q_len,
        "kv_rows": kv_len,
        "visible_pairs": visible,
        "results": results,
    }
    save_report(report, "bench_flex", args.json)
    return report


if __name__ == "__main__":
    main()
