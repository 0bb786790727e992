"""How often a fresh process's first vector-math call on the CPU comes out wrong.

Fresh processes, `--processes` of each kind, run one at a time (`--at-once N`: N at a
time; the mistake needs two threads inside the same first call at the same moment, which
processes that share the cores see less often), compute as their first math the cos of a
RoPE table ([`--rows`, 8] angles: positions times the frequencies of a head of 8) on
torch's default intra-op threads, and compare it with float64's; half of them call
`ringtrain.cpu_math.settle_cpu_math` first. The report counts the processes whose first
cos missed by more than 1e-6 (a wrong kernel's misses are about 1e-4, the accurate one's
about 1e-7), with and without the settling call.

    python -m tools.bench.bench_cpu_math --processes 100
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from tqdm import tqdm

from tools.bench.bench_report import print_report

FIRST_COS = """\
import sys
import torch
if sys.argv[1] == "settled":
    from ringtrain.cpu_math import settle_cpu_math
    settle_cpu_math()
positions = torch.arange(int(sys.argv[2]), dtype=torch.float32)
frequencies = torch.tensor([10000.0 ** (-i / 8) for i in range(0, 8, 2)])
angles = (positions[:, None] * frequencies[None, :]).repeat(1, 2)
miss = (angles.cos().double() - angles.double().cos()).abs().max().item()
print(miss)
"""
TOLERANCE = 1e-6


def first_cos_miss(mode: str, rows: int) -> float:
    """The largest miss of a fresh process's first cos (`mode`: "settled" or "plain")."""
    done = subprocess.run(
        [sys.executable, "-c", FIRST_COS, mode, str(rows)],
        capture_output=True,
        text=True,
        check=True,
    )
    return float(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--processes", type=int, default=100, help="processes of each kind")
    parser.add_argument("--at-once", type=int, default=1, help="processes running together")
    parser.add_argument("--rows", type=int, default=512, help="positions in the RoPE table")
    args = parser.parse_args(argv)
    modes = ["plain", "settled"] * args.processes
    with ThreadPoolExecutor(args.at_once) as pool:
        jobs = pool.map(first_cos_miss, modes, [args.rows] * len(modes))
        misses = list(tqdm(jobs, total=len(modes), desc="fresh processes", unit="process"))
    by_mode = {
        mode: [miss for m, miss in zip(modes, misses, strict=True) if m == mode]
        for mode in ("plain", "settled")
    }
    print_report(
        {
            "benchmark": "bench_cpu_math",
            "processes_each": args.processes,
            **{f"first_cos_wrong_{m}": sum(x > TOLERANCE for x in xs) for m, xs in by_mode.items()},
            **{f"largest_miss_{m}": max(xs) for m, xs in by_mode.items()},
        },
        "bench_cpu_math",
    )


if __name__ == "__main__":
    main()
