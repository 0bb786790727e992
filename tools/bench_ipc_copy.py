#!/usr/bin/env python3
"""Copy rate from another process's GPU memory on the same GPU, by how it is shared.

    tools/bench_ipc_copy.py [--slots 4] [--item-mb 256] [--reps 40] [--json]

A producer process allocates `--slots` buffers of `--item-mb` MiB in two ways and shares
them with a consumer process on the same GPU:

- `ipc`: one cudaMalloc slab exported with a CUDA IPC handle, as the ring's device
  transport does;
- `vmm`: torch tensors in expandable segments (CUDA virtual memory mapped in 2 MiB
  pages), which torch.multiprocessing shares through POSIX file descriptors.

The consumer times device copies of one buffer into its own memory, in GPU microseconds
per copy: from the first buffer again and again (`same`) and from every buffer in turn
(`in_turn`), for each way and for buffers of its own (`local`). The ring's consumers read
slots in turn; bench_ring showed such copies through `ipc` at about 160 us per 256 MiB on
the H200 against 129 us for the same copy repeated, while local copies in turn ran at full
speed. This tells whether the virtual memory sharing avoids that.

Prints a short table, then one JSON object as the LAST line (also written to
$OUT/bench_ipc_copy.json when $OUT is set).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import torch.multiprocessing as tmp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu_timing import gpu_us_per_call

from ringtrain.ring import cuda


def _copy_us(destination: torch.Tensor, sources: list[torch.Tensor], reps: int) -> float:
    """GPU microseconds of one copy into `destination`, from `sources` in turn."""
    return gpu_us_per_call(lambda k: destination.copy_(sources[k % len(sources)]), reps)


def _produce(slots: int, nbytes: int, shared, done) -> None:
    """Allocate both kinds of buffers, share them, keep them alive until `done`."""
    torch.cuda.set_device(0)
    slab = cuda.device_malloc(slots * nbytes, torch.device("cuda", 0))
    shared.put(cuda.ipc_get_handle(slab))
    torch.cuda.memory._set_allocator_settings("expandable_segments:True")
    vmm = [torch.ones(nbytes, dtype=torch.uint8, device="cuda") for _ in range(slots)]
    shared.put(vmm)
    done.wait()
    del vmm
    cuda.device_free(slab, torch.device("cuda", 0))


def _consume(slots: int, nbytes: int, reps: int, shared, done, results) -> None:
    """Open the producer's buffers and time the copies."""
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    ptr = cuda.ipc_open_handle(shared.get(), device)
    slab = cuda.wrap_device_pointer(ptr, slots * nbytes)
    sources = {
        "ipc": [slab[k * nbytes : (k + 1) * nbytes] for k in range(slots)],
        "local": [torch.ones(nbytes, dtype=torch.uint8, device=device) for _ in range(slots)],
    }
    report: dict = {}
    try:
        sources["vmm"] = shared.get()
    except RuntimeError as exc:  # torch builds without file-descriptor sharing of segments
        report["vmm_error"] = str(exc)
    destination = torch.empty(nbytes, dtype=torch.uint8, device=device)
    for way, buffers in sources.items():
        report[f"{way}_same_us"] = round(_copy_us(destination, buffers[:1], reps), 1)
        report[f"{way}_in_turn_us"] = round(_copy_us(destination, buffers, reps), 1)
    del sources, slab
    cuda.ipc_close(ptr, device)
    done.set()
    results.put(report)


def main(argv: list[str] | None = None) -> dict:
    """Run the producer and consumer processes and print the table and the JSON line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--item-mb", type=float, default=256.0)
    parser.add_argument("--reps", type=int, default=40)
    parser.add_argument(
        "--json", action="store_true", help="(the JSON line is always printed last)"
    )
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench_ipc_copy needs a CUDA GPU")
    nbytes = int(args.item_mb * (1 << 20))
    ctx = tmp.get_context("spawn")
    shared, results, done = ctx.Queue(), ctx.Queue(), ctx.Event()
    producer = ctx.Process(target=_produce, args=(args.slots, nbytes, shared, done))
    consumer = ctx.Process(
        target=_consume, args=(args.slots, nbytes, args.reps, shared, done, results)
    )
    producer.start()
    consumer.start()
    consumer.join()
    done.set()
    producer.join()
    if consumer.exitcode != 0 or producer.exitcode != 0:
        raise SystemExit(
            f"bench_ipc_copy: consumer exited with {consumer.exitcode}, "
            f"producer with {producer.exitcode}"
        )
    report = {"slots": args.slots, "item_mb": args.item_mb, **results.get()}
    for key, value in report.items():
        print(f"{key:<16} {value}")
    line = json.dumps(report)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "bench_ipc_copy.json").write_text(line + "\n")
    print(line)
    return report


if __name__ == "__main__":
    main()
