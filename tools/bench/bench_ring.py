#!/usr/bin/env python3
"""Benchmark the ring with real processes: throughput, integrity and control latency.

    tools/bench/bench_ring.py --transport {host,device} --producers P --consumers C --slots S \
        --item-mb M --items N [--warmup W] [--control-items K] [--json]

Phase 1 (throughput): P producer and C consumer processes move N items of M MiB of
hidden state. Every item is stamped with (producer, sequence number) at its first and
last elements and at strided positions (on the device for GPU buffers); consumers
gather the stamps of each item from their own copy (one small kernel per item) and
check them, and the descriptor, after the run. Producers write in place (as target
hooks do), except for the host transport on CUDA, where each producer copies a full
item from its GPU into the slot and each consumer copies it back to its GPU.

`gbps` is the steady delivery rate: bytes delivered into consumer buffers after the
first `--warmup` items (the first items also pay for opening IPC handles, lazy CUDA
module loads and first-touch of buffers), up to the moment the last copy completed.
`first_items_ms` is the time to the end of the warm-up. Where the time goes: each
producer's host time per item outside its waits for a free slot, and the share of the
run it spent blocked; each consumer's host time per take() outside its waits for an
item (on CUDA the copies are only queued there, on CPU they run there), and the share it
spent starved. `copy_gbps` is one plain copy of the same size on the same path (device
-> device, from the first producer's GPU to the first consumer's; pinned host -> the
consumer's GPU; or memcpy on CPU) measured in the same run, repeated on the same two
buffers; `ratio = gbps / copy_gbps`. Rank i runs on GPU i modulo the GPU count, so with
two GPUs and one producer the consumer reads the producer's slab peer to peer
(`devices`).

`--timeline` (CUDA): timing events around each take() on the consumer's stream: how long
the stream spent per item in the take (waiting for the producer's writes, then the copy)
and between takes (the stamp gather, and idle time when the next item came late); and,
during the warm-up, probes of one item's copy from a slot by memcpy and by a kernel, from
a producer's slots in turn, and of a memcpy from the consumer's own memory.
`--cprofile N`: producers and consumers run their loops under cProfile and print their
N most expensive functions (own time per item); the profiler's own cost inflates the
host times, so the rates of such a run are not the transport's.

Phase 2 (control): one producer, one consumer, one slot, empty payload; the round
trip producer publish -> consumer take -> slot free again, p50 / p99 in microseconds.

Prints a short table, then one JSON object as the LAST line (also written to
$OUT/bench_ring.json when $OUT is set).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import statistics
import time

import torch

from ringtrain.batch import HIDDEN, slot_fields
from ringtrain.ring import CONSUMER, PRODUCER, Ring, RingSpec
from ringtrain.ring.spec import dtype_name
from tools.bench.bench_report import print_report
from tools.bench.host_profile import profiled
from tools.bench.ring_copies import copy_gbps, probe_copies, stream_times

ROWS = 1024
STAMPS = 64


def _device_for(index: int) -> torch.device:
    if not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", index % torch.cuda.device_count())


def _spec(
    run_id: str, producers: int, consumers: int, slots: int, item_bytes: int, transport: str
) -> RingSpec:
    dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
    width = max(1, item_bytes // (ROWS * dtype.itemsize))
    return RingSpec(
        run_id=run_id,
        generation=0,
        ends=[PRODUCER] * producers + [CONSUMER] * consumers,
        global_ranks=list(range(producers + consumers)),
        slots_per_producer=slots,
        max_tokens=ROWS,
        max_docs=1,
        fields=slot_fields(1, width, dtype_name(dtype)),
        transport=transport,
        wait_timeout_s=1.0,
        heartbeat_timeout_s=60.0,
    )


def _stamp_positions(hidden: torch.Tensor) -> torch.Tensor:
    words = hidden.numel() * hidden.element_size() // 4
    # Integer spacing: a float32 linspace rounds the last index past the end on large items.
    return torch.arange(STAMPS, device=hidden.device) * (words - 1) // (STAMPS - 1)


def _words(hidden: torch.Tensor) -> torch.Tensor:
    return hidden.reshape(-1).view(torch.int32)


def _pattern(producer: int, seq: int) -> int:
    return (producer << 24) | seq


def _worker(index: int, spec: RingSpec, items: int, options: dict, barrier, results) -> None:
    """One rank: index 0 creates the ring; targets produce `items` each, drafters consume.
    `options`: publish_synced, cprofile (top N), timeline (see main's arguments)."""
    top = options["cprofile"]
    device = _device_for(index)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    ring = Ring.create(spec, index, device) if index == 0 else None
    barrier.wait()
    ring = ring or Ring.attach(spec.run_id, index, device)
    barrier.wait()
    ring.unlink()
    try:
        if spec.ends[index] == PRODUCER:
            synced = options["publish_synced"]
            report = profiled(top, _produce, ring, index, items, synced, barrier, device)
            results.put(("target", index, report))
        else:
            timeline = options["timeline"]
            report = profiled(top, _consume, ring, barrier, device, timeline)
            results.put(("drafter", index, report))
        ring.close(clean=True)
    except BaseException as exc:
        ring.fail(repr(exc))
        raise


def _produce(
    ring: Ring, index: int, items: int, synced: bool, barrier, device: torch.device
) -> dict:
    producer = ring.producer()
    copy_full = ring.transport == "host" and device.type == "cuda"
    source = None
    if copy_full:
        source = torch.zeros(
            (ring.spec.max_tokens, ring.spec.field(HIDDEN).width),
            dtype=ring.spec.field(HIDDEN).torch_dtype,
            device=device,
        )
    positions = None
    barrier.wait()
    start = time.monotonic_ns()
    for seq in range(items):
        slot = producer.acquire()
        target = source if copy_full else slot.hidden
        if positions is None:
            positions = _stamp_positions(target)
        _words(target).index_fill_(0, positions, _pattern(index, seq))
        if copy_full:
            slot.hidden.copy_(source, non_blocking=True)
        if synced and device.type == "cuda":
            torch.cuda.current_stream(device).synchronize()
        producer.publish(slot, ring.spec.max_tokens, 1, {"producer": index, "seq": seq})
    producer.finish()
    loop_ns = time.monotonic_ns() - start
    blocked_ns = int(ring.control.rank["blocked_ns"][ring.local_index])
    return {
        "produced": items,
        "start_ns": start,
        "host_us_per_item": (loop_ns - blocked_ns) / 1e3 / max(items, 1),
        "blocked_fraction": blocked_ns / max(loop_ns, 1),
    }


def _corrupted_stamps(stamps: list[torch.Tensor], seen: list[tuple[int, int]]) -> int:
    """Items whose gathered stamps are not their (producer, sequence) pattern."""
    if not stamps:
        return 0
    patterns = torch.tensor([_pattern(p, q) for p, q in seen], dtype=torch.int32)
    found = torch.stack(stamps).cpu()
    return int((found != patterns[:, None]).any(dim=1).sum())


def _consume(ring: Ring, barrier, device: torch.device, timeline: bool) -> dict:
    consumer = ring.consumer(device)
    marks: list[torch.cuda.Event] = []  # --timeline: before and after each take()
    probes: dict[str, float] = {}
    timeline = timeline and device.type == "cuda"
    seen: list[tuple[int, int]] = []
    taken_ns: list[int] = []
    stamps: list[torch.Tensor] = []
    mismatched_desc = 0
    nbytes = 0
    positions = None
    barrier.wait()
    started = time.monotonic_ns()
    in_take_ns = 0
    while True:
        if timeline:
            marks.append(torch.cuda.Event(enable_timing=True))
            marks[-1].record()
        before = time.monotonic_ns()
        item = consumer.take()
        taken_ns.append(time.monotonic_ns())
        if timeline and item is not None:
            marks.append(torch.cuda.Event(enable_timing=True))
            marks[-1].record()
            if len(marks) == 2:
                probes = probe_copies(
                    ring, device, item.hidden.numel() * item.hidden.element_size()
                )
        in_take_ns += taken_ns[-1] - before
        if item is None:
            taken_ns.pop()
            break
        producer, seq = item.meta["producer"], item.meta["seq"]
        if positions is None:
            positions = _stamp_positions(item.hidden)
        stamps.append(_words(item.hidden).index_select(0, positions))
        mismatched_desc += (item.seq != seq) or (item.producer_rank != producer)
        seen.append((producer, seq))
        nbytes = item.hidden.numel() * item.hidden.element_size()
    consumer.release_copied()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    end = time.monotonic_ns()
    starved_ns = int(ring.control.rank["starved_ns"][ring.local_index])
    stream_us = {**stream_times(marks), **probes} if len(marks) > 4 else {}
    return {
        "seen": seen,
        "taken_ns": taken_ns,
        "corrupted": mismatched_desc + _corrupted_stamps(stamps, seen),
        "item_bytes": nbytes,
        "end_ns": end,
        "take_us_per_item": (in_take_ns - starved_ns) / 1e3 / max(len(seen), 1),
        "starved_fraction": starved_ns / max(end - started, 1),
        **stream_us,
    }


def _control_worker(index: int, spec: RingSpec, items: int, barrier, results) -> None:
    """Round trips with an empty payload through a one-slot ring."""
    device = _device_for(0)
    ring = Ring.create(spec, index, device) if index == 0 else None
    barrier.wait()
    ring = ring or Ring.attach(spec.run_id, index, device)
    barrier.wait()
    ring.unlink()
    if index == 0:
        producer = ring.producer()
        trips = []
        slot = producer.acquire()
        for seq in range(items):
            start = time.perf_counter_ns()
            producer.publish(slot, 0, 0, {"seq": seq})
            slot = producer.acquire()
            trips.append((time.perf_counter_ns() - start) / 1e3)
        producer.publish(slot, 0, 0, {"seq": items})
        producer.finish()
        results.put(trips)
    else:
        consumer = ring.consumer(device)
        while consumer.take() is not None:
            pass
    ring.close(clean=True)


def _run(target, nprocs: int, args: tuple, expected: int) -> list:
    """Start `nprocs` spawned ranks of `target` and collect `expected` results."""
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(nprocs)
    results = ctx.Queue()
    procs = [ctx.Process(target=target, args=(i, *args, barrier, results)) for i in range(nprocs)]
    for p in procs:
        p.start()
    out = []
    while len(out) < expected:
        try:
            out.append(results.get(timeout=1.0))
        except queue.Empty:
            failed = [p for p in procs if p.exitcode not in (None, 0)]
            if failed:
                for p in procs:
                    p.kill()
                raise SystemExit(
                    f"bench worker {failed[0].name} exited with {failed[0].exitcode}"
                ) from None
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise SystemExit(f"bench worker {p.name} exited with {p.exitcode}")
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transport", choices=["host", "device"], default="host")
    parser.add_argument("--producers", type=int, default=1)
    parser.add_argument("--consumers", type=int, default=1)
    parser.add_argument("--slots", type=int, default=4, help="slots per producer")
    parser.add_argument("--item-mb", type=float, default=8.0)
    parser.add_argument(
        "--items", type=int, default=200, help="items in all (split over producers)"
    )
    parser.add_argument(
        "--warmup", type=int, default=None, help="items left out of the rate (default: 2 x slots)"
    )
    parser.add_argument(
        "--publish-synced",
        action="store_true",
        help="producers wait for their own GPU writes before publishing",
    )
    parser.add_argument("--control-items", type=int, default=2000)
    parser.add_argument(
        "--timeline",
        action="store_true",
        help="CUDA: time each take() on the consumer's stream (stream_take_us, stream_between_us)",
    )
    parser.add_argument(
        "--cprofile",
        type=int,
        default=0,
        metavar="N",
        help="print each role's N most expensive functions (slows the run)",
    )
    parser.add_argument(
        "--json", action="store_true", help="(the JSON line is always printed last)"
    )
    args = parser.parse_args(argv)
    if args.warmup is None:
        args.warmup = 2 * args.slots * args.producers
    return args


def _throughput(args: argparse.Namespace, spec: RingSpec) -> tuple[dict, list]:
    """Phase 1: the report's delivery, rate and time-split entries, and the ranks' results."""
    per_producer = -(-args.items // args.producers)
    options = {
        "publish_synced": args.publish_synced,
        "cprofile": args.cprofile,
        "timeline": args.timeline,
    }
    ranks = args.producers + args.consumers
    results = _run(_worker, ranks, (spec, per_producer, options), ranks)
    targets = [r for kind, _, r in results if kind == "target"]
    drafters = [r for kind, _, r in results if kind == "drafter"]
    produced = sum(t["produced"] for t in targets)
    seen = [s for d in drafters for s in d["seen"]]
    unique = set(seen)
    item_bytes = max(d["item_bytes"] for d in drafters)
    # Steady window: from the delivery of the warm-up's last item to the last copy done.
    taken = sorted(t for d in drafters for t in d["taken_ns"])
    warmup = min(args.warmup, len(taken) - 1)
    start_ns = min(t["start_ns"] for t in targets)
    window_start = taken[warmup - 1] if warmup > 0 else start_ns
    seconds = (max(d["end_ns"] for d in drafters) - window_start) / 1e9
    gbps = (len(taken) - warmup) * item_bytes / seconds / 1e9
    hidden_bytes = spec.max_tokens * spec.field(HIDDEN).row_bytes()
    producer_device, consumer_device = _device_for(0), _device_for(args.producers)
    plain_gbps = copy_gbps(args.transport, hidden_bytes, producer_device, consumer_device)
    report = {
        "devices": f"{producer_device} -> {consumer_device}",
        "produced": produced,
        "consumed": len(seen),
        "lost": produced - len(unique),
        "duplicated": len(seen) - len(unique),
        "corrupted": sum(d["corrupted"] for d in drafters),
        "warmup": warmup,
        "first_items_ms": round((window_start - start_ns) / 1e6, 2),
        "seconds": round(seconds, 4),
        "gbps": round(gbps, 3),
        "copy_gbps": round(plain_gbps, 3),
        "ratio": round(gbps / plain_gbps, 3),
        **_time_split(targets, drafters),
    }
    return report, results


def _time_split(targets: list[dict], drafters: list[dict]) -> dict:
    """Where the time goes: host time per item outside the waits, waiting shares, and
    (--timeline) the consumers' stream times and copy probes."""
    return {
        "producer_host_us_per_item": round(
            statistics.fmean(t["host_us_per_item"] for t in targets), 1
        ),
        "producer_blocked_fraction": round(
            statistics.fmean(t["blocked_fraction"] for t in targets), 3
        ),
        "consumer_take_us_per_item": round(
            statistics.fmean(d["take_us_per_item"] for d in drafters), 1
        ),
        "consumer_starved_fraction": round(
            statistics.fmean(d["starved_fraction"] for d in drafters), 3
        ),
        **{
            key: round(statistics.fmean(d[key] for d in drafters), 1)
            for key in (
                "stream_take_us",
                "stream_take_p50_us",
                "stream_take_p99_us",
                "stream_between_us",
                "probe_slot_memcpy_us",
                "probe_slot_kernel_us",
                "probe_slots_in_turn_memcpy_us",
                "probe_local_memcpy_us",
            )
            if all(key in d for d in drafters)
        },
    }


def main(argv: list[str] | None = None) -> dict:
    """Run both phases and print the table and the JSON line."""
    args = parse_args(argv)
    item_bytes = int(args.item_mb * (1 << 20))
    run = f"bench{os.getpid()}"
    spec = _spec(run, args.producers, args.consumers, args.slots, item_bytes, args.transport)
    throughput, results = _throughput(args, spec)
    control_spec = _spec(f"{run}c", 1, 1, 1, ROWS * 4, args.transport)
    trips = sorted(_run(_control_worker, 2, (control_spec, args.control_items), 1)[0])
    report = {
        "transport": args.transport,
        "publish_synced": args.publish_synced,
        "producers": args.producers,
        "consumers": args.consumers,
        "slots": args.slots,
        "item_mb": args.item_mb,
        **throughput,
        "control_p50_us": round(statistics.median(trips), 2),
        "control_p99_us": round(trips[int(0.99 * (len(trips) - 1))], 2),
        "cuda": torch.cuda.is_available(),
    }
    for kind, index, result in results:
        for row in result.get("profile", []):
            print(
                f"{kind} {index}: {row['us_per_item']:8.1f} us/item "
                f"{row['calls_per_item']:6.2f} calls/item  {row['function']}"
            )
    print_report(report, "bench_ring")
    return report


if __name__ == "__main__":
    main()
