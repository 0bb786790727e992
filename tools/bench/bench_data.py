"""Benchmark the data pipeline: dataset open time, batch assembly latency, padding, memory.

Writes a synthetic dataset (log-normal row lengths, shape sigma = 0.6, clipped to
[64, 8192], see ringtrain.data.synthetic) in a child process, so neither its time nor its
memory is counted, then opens it with max_len 4096 and the vocabulary check, and times
`next(stream)` plus `batch.padded()` for each batch.

    python -m tools.bench.bench_data --rows 200000 --mean-len 1000 --budget 16384 --json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import resource
import sys
import tempfile
import time

import numpy as np

from ringtrain.data import BatchStream, open_dataset, write_synthetic_dataset
from ringtrain.data.config import DataConfig

VOCAB_SIZE = 151936
BLOCK_SIZE = 16


def _status_mb(key: str) -> float:
    """A memory figure of this process from /proc/self/status (kB) in MiB."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--mean-len", type=int, default=1000)
    parser.add_argument("--budget", type=int, default=16384)
    parser.add_argument("--bucket", type=int, default=DataConfig().bucket)
    parser.add_argument("--max-len", type=int, default=4096)
    parser.add_argument("--batches", type=int, default=2000)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    return parser.parse_args(argv)


def write_dataset(directory: str, args: argparse.Namespace) -> None:
    """The synthetic dataset, written by a child process (its memory is not this one's)."""
    writer = multiprocessing.get_context("spawn").Process(
        target=write_synthetic_dataset,
        args=(directory, args.rows, VOCAB_SIZE, args.mean_len, 0),
    )
    writer.start()
    writer.join()
    if writer.exitcode:
        sys.exit(f"writing the synthetic dataset failed (exit code {writer.exitcode})")


def time_batches(directory: str, args: argparse.Namespace) -> dict:
    """Open the dataset and time `--batches` batches: wall and CPU time, padding."""
    began = time.perf_counter()
    ds = open_dataset(
        directory, max_len=args.max_len, truncate=True, block_size=BLOCK_SIZE,
        vocab_size=VOCAB_SIZE,
    )  # fmt: skip
    open_s = time.perf_counter() - began
    stream = BatchStream(ds, token_budget=args.budget, bucket=args.bucket, seed=0, rank=0, world=1)
    times, cpu_times, real, cells = [], [], 0, 0
    for _ in range(args.batches):
        began, began_cpu = time.perf_counter(), time.thread_time()
        batch = next(stream)
        padded = batch.padded()
        times.append(time.perf_counter() - began)
        cpu_times.append(time.thread_time() - began_cpu)
        real += batch.num_tokens
        cells += padded.input_ids.size
    return {
        "open_s": round(open_s, 3),
        "batch_ms_p50": round(float(np.percentile(times, 50)) * 1e3, 3),
        "batch_ms_p99": round(float(np.percentile(times, 99)) * 1e3, 3),
        # CPU time of this thread: the same without time spent descheduled (a busy
        # machine inflates the wall-clock tail).
        "batch_cpu_ms_p50": round(float(np.percentile(cpu_times, 50)) * 1e3, 3),
        "batch_cpu_ms_p99": round(float(np.percentile(cpu_times, 99)) * 1e3, 3),
        "padding_fraction": round(1 - real / cells, 4),
        "tokens_per_batch": round(real / args.batches, 1),
    }


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-data-") as directory:
        write_dataset(directory, args)
        result = {
            "rows": args.rows,
            "mean_len": args.mean_len,
            "budget": args.budget,
            "bucket": args.bucket,
            "batches": args.batches,
            **time_batches(directory, args),
            # rss_mb includes the memory-mapped dataset pages (page cache, shared by all
            # ranks on the node); rss_anon_mb is this process's private memory.
            "rss_mb": round(_status_mb("VmRSS"), 1),
            "rss_anon_mb": round(_status_mb("RssAnon"), 1),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        }
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>18}: {value}")
    return result


if __name__ == "__main__":
    main()
