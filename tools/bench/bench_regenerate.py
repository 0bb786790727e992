"""Benchmark the regenerate client: requests per second against a server that answers at once.

A real engine takes milliseconds to seconds per answer, so the client must never be what
limits a regeneration run. This starts `ringtrain/testing/chat_server.py` in a child process (on
127.0.0.1, deterministic answers, no model), writes `--records` single-turn conversations,
and runs `ringtrain.data.regenerate` on them in this process (progress bar included,
drawn to /dev/null), then checks that every record came back once.

`regenerate_client_rps` is requests answered per second of the whole run (the server's
work included: both share the machine); `client_cpu_us_per_request` is this process's
CPU time per request, what the client itself costs.

    python -m tools.bench.bench_regenerate --records 20000 --concurrency 64 --json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ringtrain.data.regen_client import Sampling
from ringtrain.data.regenerate import RegenerateOptions, regenerate
from tools.bench.bench_report import print_report

ROOT = Path(__file__).resolve().parents[2]
MODEL = "echo"


def _write_prompts(path: Path, records: int) -> None:
    with path.open("w") as out:
        for index in range(records):
            record = {"messages": [{"role": "user", "content": f"question number {index}"}]}
            out.write(json.dumps(record) + "\n")


def _count_lines(path: Path) -> set[int]:
    with path.open("rb") as lines:
        return {json.loads(line)["regeneration"]["input_line"] for line in lines}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=20000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument(
        "--json", action="store_true", help="(the JSON line is always printed last)"
    )
    args = parser.parse_args(argv)
    server = subprocess.Popen(
        [sys.executable, "-m", "ringtrain.testing.chat_server", "--port", "0"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        url = server.stdout.readline().split()[-1]
        with tempfile.TemporaryDirectory(prefix="bench-regenerate-") as directory:
            prompts, output = Path(directory, "prompts.jsonl"), Path(directory, "out.jsonl")
            _write_prompts(prompts, args.records)
            options = RegenerateOptions(
                servers=[url],
                sampling=Sampling(MODEL, max_tokens=64),
                input=prompts,
                output=output,
                concurrency=args.concurrency,
            )
            cpu_began = time.process_time()
            with open(os.devnull, "w") as devnull:
                totals = regenerate(options, progress=devnull)
            cpu_s = time.process_time() - cpu_began
            if totals.failed or _count_lines(output) != set(range(1, args.records + 1)):
                sys.exit(f"not every record came back exactly once: {totals}")
    finally:
        server.terminate()
        server.wait()
    print_report(
        {
            "regenerate_client_rps": round(totals.requests / totals.seconds, 1),
            "client_cpu_us_per_request": round(cpu_s / totals.requests * 1e6, 1),
            "records": args.records,
            "requests": totals.requests,
            "concurrency": args.concurrency,
            "seconds": round(totals.seconds, 2),
            "cpus": os.cpu_count(),
        },
        "bench_regenerate",
    )


if __name__ == "__main__":
    main()
