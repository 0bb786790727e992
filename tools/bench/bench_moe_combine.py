"""Benchmark the last step of a mixture-of-experts block: the top-k combine, alone.

After the grouped expert GEMMs the S = T x k expert outputs [S, H] are in expert order;
each token's output is the routing-weighted sum of its k rows. transformers' grouped_mm
path writes it as ``(out * w)[inv_perm].view(T, k, H).sum(1)``. Formulations timed here,
each compiled (Inductor) with static sizes and with dynamic ones (as the compiled MoE
block runs it: its sizes follow the batch), and eager:

- ``gather_sum``: that expression;
- ``scatter_sum``: the rows scattered to token order by the sort permutation (unique
  indices, so deterministic), then a contiguous sum over k;
- ``gather_bmm``: rows gathered to token order, then one batched [1, k] x [k, H] product
  with the routing weights in token order (no gather of the weights);
- ``ringtrain_kernel``: ringtrain's combine op (ringtrain/target/moe_experts.py: one
  Triton kernel reading each token's k rows once, weights in token order);
- ``unweighted_sum``: the gather and sum alone, the weights having been applied to the
  rows before the down projection (linear, so the same result up to rounding).

Qwen3-30B-A3B shape: T = 9,216 tokens, k = 8, H = 2,048, bf16. The bytes each must move
(rows read once, output written once) give its GB/s; ``max_abs_diff`` is against the
eager gather_sum (unweighted_sum: against its own eager result).

    python -m tools.bench.bench_moe_combine --json
"""

from __future__ import annotations

import argparse

import torch

import ringtrain.target.moe_experts  # noqa: F401  (registers ringtrain::moe_combine)
from tools.bench.bench_report import report_head, save_report
from tools.bench.gpu_timing import gpu_us_per_call, require_cuda


def gather_sum(out, weights_g, weights_tok, perm, inv_perm, tokens, k):
    return (out * weights_g[:, None])[inv_perm].view(tokens, k, -1).sum(1)


def scatter_sum(out, weights_g, weights_tok, perm, inv_perm, tokens, k):
    token_order = torch.empty_like(out)
    token_order[perm] = out * weights_g[:, None]
    return token_order.view(tokens, k, -1).sum(1)


def gather_bmm(out, weights_g, weights_tok, perm, inv_perm, tokens, k):
    rows = out[inv_perm].view(tokens, k, -1)
    return torch.bmm(weights_tok.view(tokens, 1, k), rows).view(tokens, -1)


def ringtrain_kernel(out, weights_g, weights_tok, perm, inv_perm, tokens, k):
    return torch.ops.ringtrain.moe_combine(out, inv_perm, weights_tok)


def unweighted_sum(out, weights_g, weights_tok, perm, inv_perm, tokens, k):
    return out[inv_perm].view(tokens, k, -1).sum(1)


FORMULATIONS = {
    f.__name__: f for f in (gather_sum, scatter_sum, gather_bmm, ringtrain_kernel, unweighted_sum)
}


def inputs(tokens: int, k: int, hidden: int, experts: int) -> tuple:
    """Expert outputs in expert order, weights in both orders, the permutation and inverse."""
    dev, dt = "cuda", torch.bfloat16
    expert_ids = torch.rand(tokens, experts, device=dev).topk(k, dim=-1).indices.reshape(-1)
    _, perm = torch.sort(expert_ids)
    inv_perm = torch.empty_like(perm)
    inv_perm[perm] = torch.arange(perm.numel(), device=dev)
    weights_tok = torch.rand(tokens, k, device=dev).softmax(-1).to(dt)
    weights_g = weights_tok.reshape(-1)[perm]
    out = torch.randn(tokens * k, hidden, device=dev, dtype=dt)
    return out, weights_g, weights_tok, perm, inv_perm


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=9216)
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--experts", type=int, default=128)
    parser.add_argument("--reps", type=int, default=50)
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    args = parser.parse_args(argv)
    require_cuda("bench_moe_combine")
    tensors = inputs(args.tokens, args.top_k, args.hidden, args.experts)
    weighted = gather_sum(*tensors, args.tokens, args.top_k).float()
    unweighted = unweighted_sum(*tensors, args.tokens, args.top_k).float()
    moved = (tensors[0].numel() + args.tokens * args.hidden) * 2
    results = []
    for name, fn in FORMULATIONS.items():
        for mode, dynamic in (("static", False), ("dynamic", True), ("eager", None)):
            torch._dynamo.reset()
            call = fn if dynamic is None else torch.compile(fn, dynamic=dynamic)
            result = call(*tensors, args.tokens, args.top_k)
            reference = unweighted if fn is unweighted_sum else weighted
            us = gpu_us_per_call(lambda _, c=call: c(*tensors, args.tokens, args.top_k), args.reps)
            results.append(
                {"formulation": name, "mode": mode, "us": us, "gb_per_s": moved / us / 1e3,
                 "max_abs_diff": float((result.float() - reference).abs().max())}
            )  # fmt: skip
    print(f"{'formulation':<16} {'mode':<9} {'us':>8} {'GB/s':>7} {'max diff':>9}")
    for r in results:
        print(f"{r['formulation']:<16} {r['mode']:<9} {r['us']:>8.1f} {r['gb_per_s']:>7.0f} "
              f"{r['max_abs_diff']:>9.2e}")  # fmt: skip
    report = {
        **report_head("bench_moe_combine"),
        "shape": {"tokens": args.tokens, "top_k": args.top_k, "hidden": args.hidden},
        "results": results,
    }
    save_report(report, "bench_moe_combine", args.json)
    return report


if __name__ == "__main__":
    main()
