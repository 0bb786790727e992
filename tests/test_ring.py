"""The ring with real processes and real shared memory: integrity, backpressure, cleanup."""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time
import uuid

import pytest
import torch

from ringtrain.batch import HIDDEN, slot_fields
from ringtrain.ring import CONSUMER, PRODUCER, Ring, RingError, RingSpec, ShmTooSmall
from ringtrain.ring.names import check_shm_space
from ringtrain.ring.spec import SlotLayout
from tests.helpers import ring_workers as rw

CTX = mp.get_context("spawn")
# Spawned ranks import torch first: tens of seconds each on a busy 2-core machine.
JOIN_S = 240


def run_id() -> str:
    return f"t{uuid.uuid4().hex[:10]}"


def shm_entries(run: str) -> list[str]:
    return [e for e in os.listdir("/dev/shm") if f"ringtrain.{run}." in e]


def start_ranks(spec: RingSpec, jobs: dict[int, tuple], first: int = 0):
    """Spawn one process per entry of `jobs` (local index -> (job, *args))."""
    barrier = CTX.Barrier(len(jobs) + (1 if first else 0))
    results = CTX.Queue()
    procs = {
        i: CTX.Process(target=rw.rank_main, args=(spec, i, barrier, results, *job), daemon=True)
        for i, job in jobs.items()
    }
    for p in procs.values():
        p.start()
    return procs, barrier, results


def test_spec_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match=r"run_id 'a b'.*\[A-Za-z0-9_-\]"):
        rw.make_spec("a b", 1, 1)
    with pytest.raises(ValueError, match="at least one producer and one consumer"):
        RingSpec(
            run_id="x", generation=0, ends=[PRODUCER], global_ranks=[0], slots_per_producer=1,
            max_tokens=1, max_docs=1, fields=slot_fields(1, 1, "float32"),
        )  # fmt: skip


def test_spec_round_trips_and_slots_are_aligned() -> None:
    spec = rw.make_spec("rt", 2, 1)
    assert RingSpec.decode(spec.encode()) == spec
    layout = SlotLayout.of(spec)
    offsets = [layout.offsets[f.name] for f in spec.fields]
    assert list(layout.offsets) == [f.name for f in slot_fields(1, rw.WIDTH, "float32")]
    assert offsets == sorted(offsets) and all(o % 512 == 0 for o in offsets)
    row_bytes = rw.WIDTH * torch.float32.itemsize
    assert layout.used_bytes(spec.max_tokens) <= layout.slot_bytes
    assert layout.used_bytes(3) == layout.offsets[HIDDEN] + 3 * row_bytes


# Rows of 64 KiB: a full item is 4 MiB, whose copy out of a slot takes a while.
STRESS_WIDTH = 16384


def test_mpmc_stress_nothing_lost_duplicated_or_corrupted() -> None:
    """Two producers of large items against two consumers that check every item. The
    consumers, which copy and check, are the slower side, so a producer mostly waits for
    its next free slot and writes the slot's end first the moment it gets it: a slot
    handed back before its copy is finished shows as a corrupted item."""
    run = run_id()
    spec = rw.make_spec(run, producers=2, consumers=2, slots=2, width=STRESS_WIDTH)
    items = 40
    jobs = {
        0: ("produce_random", items, 1, True),
        1: ("produce_random", items, 2, True),
        2: ("consume_verify",),
        3: ("consume_verify",),
    }
    procs, _, results = start_ranks(spec, jobs)
    reports = [results.get(timeout=JOIN_S) for _ in jobs]
    for p in procs.values():
        p.join(JOIN_S)
        assert p.exitcode == 0
    assert sorted(tag for tag, _, _ in reports) == ["consume_verify"] * 2 + ["produce_random"] * 2
    seen = [s for tag, _, (got, _) in (r for r in reports if r[0] == "consume_verify") for s in got]
    corrupted = sum(bad for tag, _, (_, bad) in (r for r in reports if r[0] == "consume_verify"))
    assert corrupted == 0
    assert len(seen) == len(set(seen)) == 2 * items
    assert set(seen) == {(p, s) for p in range(2) for s in range(items)}
    # Per producer, one consumer sees its items in order (FIFO).
    for _, _, (got, _) in (r for r in reports if r[0] == "consume_verify"):
        for producer in range(2):
            seqs = [s for p, s in got if p == producer]
            assert seqs == sorted(seqs)
    assert shm_entries(run) == []


def test_backpressure_blocks_producer_until_a_slot_is_freed() -> None:
    run = run_id()
    spec = rw.make_spec(run, producers=1, consumers=1, slots=2)
    ours, theirs = CTX.Pipe()
    barrier = CTX.Barrier(2)
    results = CTX.Queue()
    consumer = CTX.Process(
        target=rw.rank_main,
        args=(spec, 1, barrier, results, "consume_on_command", theirs),
        daemon=True,
    )
    consumer.start()
    ring = rw.join_ring(spec, 0, barrier)
    try:
        producer = ring.producer()
        for seq in range(2):
            slot = producer.acquire()
            rw.write_item(slot, 0, seq, 4, torch.device("cpu"))
            producer.publish(slot, 4, 1, {"producer": 0, "seq": seq})
        acquired = {}

        def blocked_acquire() -> None:
            acquired["slot"] = producer.acquire()
            acquired["ns"] = time.monotonic_ns()

        thread = threading.Thread(target=blocked_acquire)
        thread.start()
        wait_start = ring.control.rank["wait_start_ns"]
        # The producer thread is inside its blocking wait (not merely scheduled).
        assert _poll(lambda: int(wait_start[0]) != 0)
        assert "ns" not in acquired and ring.snapshot().slot_counts["ready"] == 2
        ours.send("take")
        take_started, seq = ours.recv()
        thread.join(JOIN_S)
        assert seq == 0
        # Order: producer blocked, then the consumer started its take, then acquire returned.
        assert acquired["ns"] > take_started
        assert acquired["slot"].index == 0  # the slot the consumer freed
        assert ring.snapshot().ranks[0].blocked_ns > 0
        producer.publish(acquired["slot"], 1, 1, {"producer": 0, "seq": 2})
        producer.finish()
        ours.send("stop")
        consumer.join(JOIN_S)
        assert consumer.exitcode == 0
    finally:
        ring.close()
    assert shm_entries(run) == []


def _poll(condition, timeout_s: float = 10.0) -> bool:
    """Wait for a condition by re-checking it on short event timeouts (no sleep as sync)."""
    tick = threading.Event()
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        tick.wait(0.005)
    return True


def test_crashed_creator_leaves_nothing_after_next_start() -> None:
    run = run_id()
    created = CTX.Event()
    crasher = CTX.Process(target=rw.crash_after_create, args=(rw.make_spec(run, 1, 1), created))
    crasher.start()
    crasher.join(JOIN_S)
    assert created.is_set() and crasher.exitcode == -9
    assert shm_entries(run)  # the crash leaked its names (never unlinked)
    other = run_id()
    ring = Ring.create(rw.make_spec(other, 1, 1), 0, "cpu")  # stale cleanup of the dead run
    try:
        assert shm_entries(run) == []
        assert shm_entries(other)
    finally:
        ring.close()
    assert shm_entries(other) == []


def test_same_run_id_of_live_creator_is_refused() -> None:
    run = run_id()
    ring = Ring.create(rw.make_spec(run, 1, 1), 0, "cpu")
    try:
        with pytest.raises(
            RingError,
            match=rf"ring '{run}' is already in use by a live process \(pid {os.getpid()}\)",
        ):
            Ring.create(rw.make_spec(run, 1, 1), 0, "cpu")
    finally:
        ring.close()


def test_shm_too_small_says_how_much_and_how_to_fix(tmp_path) -> None:
    with pytest.raises(
        ShmTooSmall, match=r"needs .* MiB in .* but only .* MiB are free.*--shm-size"
    ):
        check_shm_space(1 << 62, str(tmp_path))
    run = run_id()
    huge = RingSpec(
        run_id=run, generation=0, ends=[PRODUCER, CONSUMER], global_ranks=[0, 1],
        slots_per_producer=64, max_tokens=1 << 20, max_docs=1,
        fields=slot_fields(1, 1 << 12, "float32"), transport="host",
    )  # fmt: skip
    with pytest.raises(ShmTooSmall, match="/dev/shm"):
        Ring.create(huge, 0, "cpu")
    assert shm_entries(run) == []


def test_attach_to_missing_ring_names_the_fix() -> None:
    with pytest.raises(RingError, match="local rank 0 must create it"):
        Ring.attach("nosuchring", 1, "cpu")


def test_auto_transport_falls_back_to_host_without_cuda_ranks() -> None:
    ring = Ring.create(rw.make_spec(run_id(), 1, 1, transport="auto"), 0, "cpu")
    try:
        assert ring.transport == "host"
        assert "not on a CUDA GPU" in ring.snapshot().transport_reason
    finally:
        ring.close()
    with pytest.raises(RingError, match="transport = 'device' needs CUDA ranks"):
        Ring.create(rw.make_spec(run_id(), 1, 1, transport="device"), 0, "cpu")


def test_wait_spins_again_after_progress_and_sleeps_only_without_it() -> None:
    """A waiting consumer frees its oldest copied slot and spins again; it sleeps on the
    semaphore only when nothing is left to free (handoff.py), and wakes when it is released."""
    ring = Ring.create(rw.make_spec(run_id(), 1, 1), 0, "cpu")
    progress_left = [2]
    calls = []
    going_to_sleep = threading.Event()

    def before_block() -> bool:
        calls.append(progress_left[0])
        if progress_left[0]:
            progress_left[0] -= 1
            return True
        going_to_sleep.set()
        return False

    def release_once_asleep() -> None:
        if going_to_sleep.wait(10):
            ring.handoff.release_ready()

    releaser = threading.Thread(target=release_once_asleep)
    releaser.start()
    try:
        ring.handoff.wait_ready(10, before_block=before_block)
        assert calls == [2, 1, 0]
        assert int(ring.control.rank["starved_ns"][0]) > 0
    finally:
        releaser.join()
        ring.close()
