"""Benchmark row_topk's kernel (ringtrain/drafter/row_topk.py) under its launch choices.

The chunked loss ranks each chunk's rows twice for DFlash2's candidates: the 768 group
maxima of a 49,152-token vocabulary, then the 1,024 entries of the 16 best groups, 16
ids of each. Timed here for the default 4,096-row chunk and the recipe's 16,384-row one,
each at every (rows per program, warps) pair; ``matches_topk`` says whether the ids equal
torch.topk's (random float32 rows can hold equal entries, whose order may differ: the
same for every launch choice). The shipped choice is ``row_topk.ROWS_PER_PROGRAM`` and
``row_topk.WARPS``.

    python -m tools.bench.bench_row_topk --json
"""

from __future__ import annotations

import argparse
import itertools

import torch

from ringtrain.drafter import row_topk
from tools.bench.bench_report import report_head, save_report
from tools.bench.gpu_timing import gpu_us_per_call, require_cuda

SHAPES = ((4096, 768), (4096, 1024), (16384, 768), (16384, 1024))
CHOICES = (1, 2, 4, 8)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--top-k", type=int, default=16)
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    args = parser.parse_args(argv)
    require_cuda("bench_row_topk")
    shipped = (row_topk.ROWS_PER_PROGRAM, row_topk.WARPS)
    results = []
    for rows, width in SHAPES:
        values = torch.randn(
            rows, width, device="cuda", generator=torch.Generator("cuda").manual_seed(0)
        )
        reference = values.topk(args.top_k, dim=-1).indices
        for per_program, warps in itertools.product(CHOICES, CHOICES):

            def launch(_: int, v=values, p=per_program, w=warps) -> torch.Tensor:
                return row_topk.row_topk_cuda(v, args.top_k, p, w)

            results.append(
                {"rows": rows, "width": width, "rows_per_program": per_program, "warps": warps,
                 "us": gpu_us_per_call(launch, args.reps),
                 "matches_topk": bool(torch.equal(launch(0), reference)),
                 "shipped": (per_program, warps) == shipped}
            )  # fmt: skip
    print(f"{'rows':>6} {'width':>6} {'shipped us':>11} {'best us':>8}  best (rows/program, warps)")
    for rows, width in SHAPES:
        mine = [r for r in results if (r["rows"], r["width"]) == (rows, width)]
        best = min(mine, key=lambda r: r["us"])
        ours = next(r for r in mine if r["shipped"])
        print(f"{rows:>6} {width:>6} {ours['us']:>11.1f} {best['us']:>8.1f}  "
              f"({best['rows_per_program']}, {best['warps']})")  # fmt: skip
    report = {
        **report_head("bench_row_topk"),
        "top_k": args.top_k,
        "results": results,
    }
    save_report(report, "bench_row_topk", args.json)
    return report


if __name__ == "__main__":
    main()
