"""Process bodies for the ring tests (spawned with multiprocessing; importable by name).

Every worker reports through a multiprocessing queue as (tag, local index, payload).
Items carry a verifiable pattern: hidden rows = producer * 1e5 + seq, input_ids =
seq + row, cu_seqlens = [0, n], meta = {"producer", "seq"}. The hidden width is the
ring's (``make_spec(width=...)``; WIDTH unless given).
"""

from __future__ import annotations

import dataclasses
import mmap
import os
import random
import signal
import threading
import time
import uuid

import torch

from ringtrain.batch import slot_fields
from ringtrain.ring import CONSUMER, PRODUCER, PeerDied, Ring, RingSpec
from ringtrain.ring import control as cb
from ringtrain.trainer.outcome import FAILED, OUTCOME_DIR_ENV, Outcome, report_outcome
from ringtrain.trainer.signals import StopRequest

MAX_TOKENS = 64
STEP_S = 1.0  # stuck_in_training's first step
WIDTH = 8


def run_id() -> str:
    """A ring name of its own for one test."""
    return f"t{uuid.uuid4().hex[:10]}"


def make_spec(
    run_id: str,
    producers: int,
    consumers: int,
    slots: int = 2,
    heartbeat_timeout_s: float = 30.0,
    transport: str = "host",
    width: int = WIDTH,
) -> RingSpec:
    """A small CPU ring: producers first, then consumers, labelled as a run labels its
    targets and drafters; global rank = 10 + local index."""
    n = producers + consumers
    return RingSpec(
        run_id=run_id,
        generation=3,
        ends=[PRODUCER] * producers + [CONSUMER] * consumers,
        labels=["target"] * producers + ["drafter"] * consumers,
        global_ranks=[10 + i for i in range(n)],
        slots_per_producer=slots,
        max_tokens=MAX_TOKENS,
        max_docs=4,
        fields=slot_fields(1, width, "float32"),
        transport=transport,
        wait_timeout_s=0.2,
        heartbeat_timeout_s=heartbeat_timeout_s,
    )


def anonymous_control_block(spec: RingSpec) -> cb.ControlBlock:
    """A control block of `spec` in anonymous memory, zeroed: no ring's objects and no
    heartbeat or watchdog threads write to it, so a test sets its tables as it likes."""
    return cb.ControlBlock(mmap.mmap(-1, cb.ControlLayout(spec).total_bytes), spec)


def in_process_ranks(producers: int, consumers: int, **changes) -> list[Ring]:
    """Every rank of a small CPU ring in this process: local index 0 creates it, the
    others attach (global rank = 10 + local index); `changes` replace spec fields."""
    spec = dataclasses.replace(make_spec(run_id(), producers, consumers), **changes)
    first = Ring.create(spec, 0, "cpu")
    return [first, *(Ring.attach(spec.run_id, i, "cpu") for i in range(1, spec.num_ranks))]


def close_ranks(rings: list[Ring]) -> None:
    """Close in_process_ranks' rings, the creator last."""
    for ring in reversed(rings):
        ring.close()


def write_item(
    slot, producer: int, seq: int, num_tokens: int, device: torch.device, tail_first: bool = False
) -> None:
    """Stamp the test pattern into a WriteSlot from tensors built on `device`. With
    `tail_first`, the last hidden row is written before anything else: the end of the slot
    that a consumer copying from its start reaches last."""
    n = num_tokens
    width = slot.arrays["hidden"].shape[1]
    value = float(producer * 100_000 + seq)
    if tail_first:
        slot.arrays["hidden"][n - 1].fill_(value)
    rows = torch.arange(n, dtype=torch.int32, device=device)
    parts = {
        "hidden": torch.full((n, width), value, device=device),
        "input_ids": rows + seq,
        "loss_mask": torch.full((n,), seq % 2, dtype=torch.uint8, device=device),
        "position_ids": rows,
        "cu_seqlens": torch.tensor([0, n], dtype=torch.int32, device=device),
    }
    for name, value in parts.items():
        slot.arrays[name][: len(value)].copy_(value, non_blocking=True)


def publish(producer, seq: int, num_tokens: int = 4, num_docs: int = 1) -> None:
    """Publish item `seq` of `producer` (a ring Producer on the CPU): the test pattern
    in `num_docs` documents of near-equal length."""
    slot = producer.acquire()
    me = producer.index
    write_item(slot, me, seq, num_tokens, torch.device("cpu"))
    bounds = torch.linspace(0, num_tokens, num_docs + 1).round().to(torch.int32)
    slot.cu_seqlens[: num_docs + 1].copy_(bounds)
    producer.publish(slot, num_tokens, num_docs, {"producer": me, "seq": seq})


def item_ok(item) -> bool:
    """Whether a ReadItem carries exactly the pattern of its (producer, seq)."""
    producer, seq, n = item.meta["producer"], item.meta["seq"], item.num_tokens
    return (
        item.seq == seq
        and item.num_docs == 1
        and item.hidden.shape[0] == n
        and bool((item.hidden == float(producer * 100_000 + seq)).all())
        and bool((item.input_ids.cpu() == torch.arange(n, dtype=torch.int32) + seq).all())
        and bool((item.loss_mask.cpu() == seq % 2).all())
        and item.cu_seqlens.cpu().tolist() == [0, n]
    )


def join_ring(spec: RingSpec, index: int, barrier, device: str = "cpu") -> Ring:
    """Index 0 creates, the others attach after a barrier; everybody unlinks after a second one."""
    ring = Ring.create(spec, index, device) if index == 0 else None
    barrier.wait()
    ring = ring or Ring.attach(spec.run_id, index, device)
    barrier.wait()
    ring.unlink()
    return ring


def rank_main(spec: RingSpec, index: int, barrier, results, job: str, *args) -> None:
    """One rank of a test ring running `job` (a function name of this module)."""
    device = "cuda" if job.endswith("_cuda") else "cpu"
    ring = join_ring(spec, index, barrier, device)
    try:
        results.put((job, index, globals()[job](ring, *args)))
        ring.close(clean=True)
    except PeerDied as exc:
        results.put(("peer_died", index, str(exc)))
        ring.close(clean=True)
    except Exception as exc:  # reported at once: the test need not wait out its time limit
        results.put(("failed", index, repr(exc)))
        ring.close(clean=False)
        raise


def produce_random(ring: Ring, items: int, seed: int, tail_first: bool = False) -> tuple[int, str]:
    """Publish `items` items of random sizes (written `tail_first` or not, see write_item);
    returns (count, transport used)."""
    rng = random.Random(seed)
    producer = ring.producer()
    me = ring.spec.producers.index(ring.local_index)
    for seq in range(items):
        n = rng.randint(1, MAX_TOKENS)
        slot = producer.acquire()
        write_item(slot, me, seq, n, ring.device, tail_first)
        producer.publish(slot, n, 1, {"producer": me, "seq": seq})
    producer.finish()
    return items, ring.transport


produce_random_cuda = produce_random


def consume_verify(ring: Ring) -> tuple[list[tuple[int, int]], int]:
    """Take until the end; returns ((producer, seq) seen, number of corrupted items)."""
    consumer = ring.consumer()
    seen, corrupted = [], 0
    while (item := consumer.take()) is not None:
        seen.append((item.meta["producer"], item.meta["seq"]))
        corrupted += not item_ok(item)
    return seen, corrupted


consume_verify_cuda = consume_verify


def consume_on_command(ring: Ring, commands) -> None:
    """Take one item per command received on a pipe; reply with (start time, seq)."""
    consumer = ring.consumer()
    while commands.recv() == "take":
        started = time.monotonic_ns()
        item = consumer.take()
        commands.send((started, item.meta["seq"]))


def hang_mid_read(ring: Ring, reached) -> None:
    """Take one item but stop inside the copy (slot READING) until killed."""
    consumer = ring.consumer()
    payload = ring.payload

    def stuck(slot: int):
        reached.set()
        signal.pause()

    payload.reader_bytes = stuck
    consumer.take()


def take_after(ring: Ring, go) -> str:
    """Wait for `go`, then take until the end of the stream (PeerDied goes to rank_main)."""
    consumer = ring.consumer()
    go.wait()
    while consumer.take() is not None:
        pass
    return "end of stream"


def hang_mid_write(ring: Ring, reached) -> None:
    """Acquire a slot and stop before publishing (slot WRITING) until killed."""
    ring.producer().acquire()
    reached.set()
    signal.pause()


def wait_for_kill(ring: Ring, attached) -> None:
    """Stay attached and alive until killed."""
    attached.set()
    signal.pause()


def crash_after_create(spec: RingSpec, created) -> None:
    """Create a ring (names not unlinked) and die at once with SIGKILL."""
    Ring.create(spec, 0, "cpu")
    created.set()
    os.kill(os.getpid(), signal.SIGKILL)


def hold_mapped(path: str, mapped, release) -> None:
    """Keep the file at ``path`` mapped (as a rank keeps its control segment) until
    ``release`` is set."""
    with open(path, "r+b") as segment, mmap.mmap(segment.fileno(), 0) as _view:
        mapped.set()
        release.wait()


def idle_rank(spec: RingSpec, index: int, barrier, results) -> None:
    """A rank that joins the ring, says so, and waits until it is killed."""
    join_ring(spec, index, barrier)
    results.put(("ready", index, os.getpid()))
    threading.Event().wait()


def start_up_rank(spec: RingSpec, index: int, barrier, results) -> None:
    """A trainer rank in its start-up (nothing trained yet): stop signals handled as a
    rank handles them, the ring's watchdog reporting a peer's failure on `results` and
    ending the process with 1; it waits until a signal ends it."""
    ring = join_ring(spec, index, barrier)

    def on_dead(exc: PeerDied) -> None:
        results.put(("peer_died", index, str(exc)))
        results.close()
        results.join_thread()
        os._exit(1)

    ring.start_watchdog(on_dead)
    StopRequest().install()
    results.put(("ready", index, os.getpid()))
    threading.Event().wait()


def stuck_in_training(spec: RingSpec, index: int, barrier, results, outcome_dir: str) -> None:
    """A trainer rank in training (its first step took STEP_S) whose second step never
    ends: stop signals handled as a rank handles them, its outcome written into
    `outcome_dir` as under ringtrain-launch; it waits until a signal ends it."""
    os.environ[OUTCOME_DIR_ENV] = outcome_dir
    ring = join_ring(spec, index, barrier)
    ring.own_row.record_progress(1)
    time.sleep(STEP_S)  # the first step's work
    ring.own_row.record_progress(2)
    StopRequest().install()
    results.put(("ready", index, os.getpid()))
    threading.Event().wait()  # the second step


def stop_after_the_outcome(results) -> None:
    """A rank that has said how it ends (a failure) when the launcher's SIGTERM comes: the
    stop is acted on as a rank acts on it, then this returns (exit 0) unless it ended the
    process."""
    report_outcome(Outcome(0, 1, FAILED, "CUDA out of memory"))
    StopRequest().on_stop_signal(signal.SIGTERM)
    results.put("returned")
    results.close()
    results.join_thread()
