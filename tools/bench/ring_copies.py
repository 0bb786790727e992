"""How fast bench_ring's copies could be: one item's copy timed on the GPU in isolation
(--timeline probes), the consumer stream's time per take() from its timing events, and a
plain copy of an item on the transport's path (the rate the ring is compared with)."""

from __future__ import annotations

import statistics
import time

import torch

from ringtrain.ring import Ring
from tools.bench.gpu_timing import gpu_us_per_call


def probe_copies(ring: Ring, device: torch.device, nbytes: int) -> dict:
    """--timeline: one item's copy into a scratch buffer (only timed: contents do not
    matter), in GPU microseconds: from slot 0 by memcpy and by an elementwise kernel, from
    the first producer's slots in turn by memcpy, and by memcpy from memory of this
    process (torch's allocator)."""
    sources = [ring.payload.reader_bytes(s)[:nbytes] for s in range(ring.spec.slots_per_producer)]
    source = sources[0]
    scratch = torch.empty(nbytes, dtype=torch.uint8, device=device)
    local = torch.ones(nbytes, dtype=torch.uint8, device=device)
    words, scratch_words = source.view(torch.int64), scratch.view(torch.int64)
    return {
        "probe_slot_memcpy_us": gpu_us_per_call(lambda k: scratch.copy_(source), 20),
        "probe_slot_kernel_us": gpu_us_per_call(
            lambda k: torch.bitwise_or(words, 0, out=scratch_words), 20
        ),
        "probe_slots_in_turn_memcpy_us": gpu_us_per_call(
            lambda k: scratch.copy_(sources[k % len(sources)]), 20
        ),
        "probe_local_memcpy_us": gpu_us_per_call(lambda k: scratch.copy_(local), 20),
    }


def stream_times(marks: list[torch.cuda.Event]) -> dict[str, float]:
    """--timeline, over the items after the first quarter: GPU time from before a take()
    to after it (the wait for the producer's event plus the copy), and from after it to
    the next take() (the stamp gather, plus idle time when the next copy came late)."""
    pairs = range(len(marks) // 8, len(marks) // 2 - 1)
    takes = sorted(marks[2 * k].elapsed_time(marks[2 * k + 1]) * 1e3 for k in pairs)
    return {
        "stream_take_us": statistics.fmean(takes),
        "stream_take_p50_us": takes[len(takes) // 2],
        "stream_take_p99_us": takes[int(0.99 * (len(takes) - 1))],
        "stream_between_us": statistics.fmean(
            marks[2 * k + 1].elapsed_time(marks[2 * k + 2]) * 1e3 for k in pairs
        ),
    }


def copy_gbps(
    transport: str, item_bytes: int, source: torch.device, destination: torch.device
) -> float:
    """One plain copy of `item_bytes` on the path the transport uses, repeated, in GB/s:
    from the producer's device (`source`; pinned host memory for the host transport) to
    the consumer's (`destination`)."""
    cuda = destination.type == "cuda"
    dst = torch.empty(item_bytes, dtype=torch.uint8, device=destination)
    on_device = transport == "device" and cuda
    src = torch.ones(item_bytes, dtype=torch.uint8, device=source if on_device else "cpu")
    if cuda and not on_device:
        src = src.pin_memory()
    reps = 20 if cuda else 10
    if cuda:
        with torch.cuda.device(destination):
            us = gpu_us_per_call(lambda k: dst.copy_(src, non_blocking=True), reps)
        return item_bytes / us / 1e3
    dst.copy_(src)
    start = time.perf_counter()
    for _ in range(reps):
        dst.copy_(src)
    return reps * item_bytes / (time.perf_counter() - start) / 1e9
