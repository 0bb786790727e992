"""The ring with real processes and real shared memory: integrity, backpressure, cleanup."""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import threading
import time

import pytest
import torch

from ringtrain.batch import HIDDEN, slot_fields
from ringtrain.ring import (
    CONSUMER,
    PRODUCER,
    Ring,
    RingError,
    RingSpec,
    RingTimeout,
    ShmTooSmall,
)
from ringtrain.ring import control as cb
from ringtrain.ring.names import check_shm_space
from ringtrain.ring.spec import SlotLayout
from tests.helpers import ring_workers as rw

CTX = mp.get_context("spawn")
# Spawned ranks import torch first: tens of seconds each on a busy 2-core machine.
JOIN_S = 240


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


def test_control_tables_and_fields_hold_what_fits_and_refuse_a_longer_descriptor() -> None:
    spec = rw.make_spec("cf", 1, 1)
    block = rw.anonymous_control_block(spec)
    try:
        # The tables do not overlap: each keeps what was written to it.
        block.slots["seq"], block.ranks["step"], block.fifo[:] = 7, 8, 9
        assert (block.slots["seq"] == 7).all() and (block.ranks["step"] == 8).all()
        assert (block.fifo == 9).all() and int(block.header["magic"]) == 0
        row = block.ranks[0]
        cb.put_bytes(row, "doing", b"d" * (cb.DOING_BYTES + 5))  # cut to the field
        assert cb.get_bytes(row["doing"], row["doing_len"]) == b"d" * cb.DOING_BYTES
        last = spec.num_slots - 1
        block.write_desc(last, b"x" * cb.DESC_BYTES)  # exactly the field's size
        assert block.read_desc(last) == b"x" * cb.DESC_BYTES
        with pytest.raises(ValueError, match=f"{cb.DESC_BYTES + 1} bytes exceeds {cb.DESC_BYTES}"):
            block.write_desc(0, b"y" * (cb.DESC_BYTES + 1))
        assert block.read_desc(0) == b""  # nothing written
    finally:
        block.drop()


# Rows of 64 KiB: a full item is 4 MiB, whose copy out of a slot takes a while.
STRESS_WIDTH = 16384


def test_mpmc_stress_nothing_lost_duplicated_or_corrupted() -> None:
    """Two producers of large items against two consumers that check every item. The
    consumers, which copy and check, are the slower side, so a producer mostly waits for
    its next free slot and writes the slot's end first the moment it gets it: a slot
    handed back before its copy is finished shows as a corrupted item."""
    run = rw.run_id()
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
    run = rw.run_id()
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
        for seq in range(2):  # each of its slots is free at once, with nobody taking
            slot = producer.acquire(timeout=10.0)
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
        assert seq == 0 and int(wait_start[0]) == 0  # its wait is over
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
    run = rw.run_id()
    created = CTX.Event()
    crasher = CTX.Process(target=rw.crash_after_create, args=(rw.make_spec(run, 1, 1), created))
    crasher.start()
    crasher.join(JOIN_S)
    assert created.is_set() and crasher.exitcode == -9
    assert shm_entries(run)  # the crash leaked its names (never unlinked)
    other = rw.run_id()
    ring = Ring.create(rw.make_spec(other, 1, 1), 0, "cpu")  # stale cleanup of the dead run
    try:
        assert shm_entries(run) == []
        assert shm_entries(other)
    finally:
        ring.close()
    assert shm_entries(other) == []


def test_same_run_id_of_live_creator_is_refused() -> None:
    run = rw.run_id()
    ring = Ring.create(rw.make_spec(run, 1, 1), 0, "cpu")
    try:
        with pytest.raises(
            RingError,
            match=rf"ring '{run}' is already in use by a live process \(pid {os.getpid()}\)",
        ):
            Ring.create(rw.make_spec(run, 1, 1), 0, "cpu")
    finally:
        ring.close()


def test_an_index_outside_the_ring_and_a_spec_too_long_for_its_field_are_refused() -> None:
    rings = rw.in_process_ranks(producers=1, consumers=1)
    try:
        with pytest.raises(RingError, match="local index 2 is outside the ring's 2 ranks"):
            Ring.attach(rings[0].spec.run_id, len(rings), "cpu")
    finally:
        rw.close_ranks(rings)
    crowded = rw.make_spec(rw.run_id(), 1, 300)  # about 6 KB encoded
    assert len(crowded.encode()) > cb.SPEC_BYTES
    with pytest.raises(RingError, match=r"ring spec encodes to \d+ bytes, over 4096"):
        Ring.create(crowded, 0, "cpu")
    assert shm_entries(crowded.run_id) == []


def test_a_creation_that_fails_part_way_leaves_nothing(tmp_path) -> None:
    run = rw.run_id()
    spec = dataclasses.replace(rw.make_spec(run, 1, 1), lock_dir=str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError):  # the lock file, after the control block
        Ring.create(spec, 0, "cpu")
    assert shm_entries(run) == []


def test_closing_a_ring_whose_names_were_taken_over_leaves_the_new_ring_s_names() -> None:
    run = rw.run_id()
    first = Ring.create(rw.make_spec(run, 1, 1), 0, "cpu")
    first.unlink()  # as every rank does once all attached; the mappings stay
    second = Ring.create(rw.make_spec(run, 1, 1), 0, "cpu")
    try:
        named = shm_entries(run)
        first.close()
        assert shm_entries(run) == named != []
    finally:
        second.close()
    assert shm_entries(run) == []


def test_the_gpu_shares_are_those_ranks_measured() -> None:
    target, drafter = rings = rw.in_process_ranks(producers=1, consumers=1)
    try:
        assert target.gpu_busy_by_rank() == {}  # nobody measured one
        drafter.own_row.report_gpu_busy(0.75)
        target.own_row.report_gpu_busy(None)  # could not measure
        assert target.gpu_busy_by_rank() == {11: 0.75}
    finally:
        rw.close_ranks(rings)


def test_the_consumers_step_is_read_from_the_consumer_ranks() -> None:
    target, *drafters = rings = rw.in_process_ranks(producers=1, consumers=2)
    try:
        target.own_row.record_progress(9)  # a target's count is not the consumers' step
        drafters[0].own_row.record_progress(4)
        drafters[1].own_row.record_progress(5)
        assert target.consumer_step() == 5
    finally:
        rw.close_ranks(rings)


def test_shm_too_small_says_how_much_and_how_to_fix(tmp_path) -> None:
    with pytest.raises(
        ShmTooSmall, match=r"needs .* MiB in .* but only .* MiB are free.*--shm-size"
    ):
        check_shm_space(1 << 62, str(tmp_path))
    run = rw.run_id()
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
    ring = Ring.create(rw.make_spec(rw.run_id(), 1, 1, transport="auto"), 0, "cpu")
    try:
        assert ring.transport == "host"
        assert "not on a CUDA GPU" in ring.snapshot().transport_reason
    finally:
        ring.close()
    with pytest.raises(RingError, match="transport = 'device' needs CUDA ranks"):
        Ring.create(rw.make_spec(rw.run_id(), 1, 1, transport="device"), 0, "cpu")


def test_wait_spins_again_after_progress_and_sleeps_only_without_it() -> None:
    """A waiting consumer frees its oldest copied slot and spins again; it sleeps on the
    semaphore only when nothing is left to free (handoff.py), and wakes when it is released."""
    ring = Ring.create(rw.make_spec(rw.run_id(), 1, 1), 0, "cpu")
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


# ---- the slot protocol on in-process rings (real shared memory, one rank per Ring) ---------

# A blocked waiter that an unclean close wakes returns within this; its own wait rounds
# (wait_timeout_s) are made far longer, so only the wake-up can end it in time.
WAKE_S = 5.0


def _recording(call) -> tuple[threading.Thread, list[BaseException]]:
    """`call` started in a thread that records what it raised."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # recorded for the test to check
            raised.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, raised


def _raised_within(seconds: float, call) -> BaseException | None:
    """What `call` raised (None if it returned), run in a thread that must end within
    `seconds`: a wait that misses its own timeout fails the test instead of hanging it."""
    thread, raised = _recording(call)
    thread.join(seconds)
    assert not thread.is_alive(), f"still waiting after {seconds} s"
    return raised[0] if raised else None


def test_a_consumer_sees_the_end_only_once_every_producer_finished() -> None:
    rings = rw.in_process_ranks(producers=2, consumers=1)
    try:
        first, second = rings[0].producer(), rings[1].producer()
        consumer = rings[2].consumer()
        first.finish()
        # The first producer's finish wakes the consumer, but the second still produces.
        timed_out = _raised_within(WAKE_S, lambda: consumer.take(timeout=0.5))
        assert isinstance(timed_out, RingTimeout), timed_out
        assert "waited 0.5 s for a ready slot" in str(timed_out)
        rw.publish(second, 0)
        item = consumer.take(timeout=JOIN_S)
        assert item is not None and rw.item_ok(item) and item.meta["producer"] == 1
        rings[1].close()  # a producer that leaves cleanly has finished too
        assert consumer.take(timeout=WAKE_S) is None
    finally:
        rw.close_ranks(rings)


def test_a_producer_goes_on_while_one_of_its_consumers_is_still_open() -> None:
    rings = rw.in_process_ranks(producers=1, consumers=2)
    try:
        producer = rings[0].producer()
        for seq in range(2):
            rw.publish(producer, seq)
        rings[1].close(clean=True)  # one drafter left; the other still reads
        # Both slots are taken: the wait times out (every peer alive), it is not closed.
        timed_out = _raised_within(WAKE_S, lambda: producer.acquire(timeout=0.5))
        assert isinstance(timed_out, RingTimeout), timed_out
        assert "waited 0.5 s for a free slot" in str(timed_out)
        item = rings[2].consumer().take(timeout=JOIN_S)
        assert item is not None and item.meta["seq"] == 0
        assert producer.acquire(timeout=JOIN_S).index == 0  # the slot it freed
    finally:
        rw.close_ranks([rings[0], rings[2]])


def test_a_wait_refreshes_progress_even_when_its_token_is_there_at_once() -> None:
    rings = rw.in_process_ranks(producers=1, consumers=1)
    try:
        progress = rings[0].control.rank["progress_ns"]
        progress[0] = time.monotonic_ns() - 10**12  # silent for 1000 s
        before = time.monotonic_ns()
        rings[0].producer().acquire()  # a slot is free: no wait at all
        assert int(progress[0]) >= before
    finally:
        rw.close_ranks(rings)


def _blocked(wait, ring: Ring, index: int) -> tuple[threading.Thread, list[BaseException]]:
    """Run `wait` in a thread that records what it raised; return once the thread is
    inside its blocking wait (its rank's wait_start_ns is set)."""
    thread, raised = _recording(wait)
    assert _poll(lambda: int(ring.control.rank["wait_start_ns"][index]) != 0)
    return thread, raised


def test_an_unclean_close_wakes_blocked_producers_and_consumers_at_once() -> None:
    # Two consumers waiting for a ready slot; their producer closes unclean.
    target, *drafters = rw.in_process_ranks(producers=1, consumers=2, wait_timeout_s=60.0)
    try:
        waits = [_blocked(d.consumer().take, d, i) for i, d in enumerate(drafters, start=1)]
        target.close(clean=False)
        for thread, raised in waits:
            thread.join(WAKE_S)
            assert not thread.is_alive() and "rank 10 (target" in str(raised[0])
    finally:
        for ring in (*drafters, target):
            ring.close(clean=False)
    # A producer waiting for a free slot; its consumer closes unclean.
    target, drafter = rw.in_process_ranks(producers=1, consumers=1, wait_timeout_s=60.0)
    try:
        producer = target.producer()
        for seq in range(2):
            rw.publish(producer, seq)
        thread, raised = _blocked(producer.acquire, target, 0)
        drafter.close(clean=False)
        thread.join(WAKE_S)
        assert not thread.is_alive() and "rank 11 (drafter" in str(raised[0])
    finally:
        target.close(clean=False)
        drafter.close(clean=False)


def test_items_name_their_producer_and_their_own_document_count() -> None:
    """One slot per producer: the second item of a producer reuses the slot of its first,
    with as many tokens but more documents."""
    rings = rw.in_process_ranks(producers=2, consumers=1, slots_per_producer=1)
    try:
        producers = [rings[0].producer(), rings[1].producer()]
        consumer = rings[2].consumer()
        for seq, num_docs in enumerate((1, 2)):
            for producer in producers:
                rw.publish(producer, seq, num_tokens=4, num_docs=num_docs)
                item = consumer.take(timeout=JOIN_S)
                assert item.producer_rank == 10 + producer.index
                assert (item.seq, item.num_docs) == (seq, num_docs)
                assert item.cu_seqlens.tolist() == ([0, 4] if num_docs == 1 else [0, 2, 4])
    finally:
        rw.close_ranks(rings)


def test_an_item_may_fill_the_slot_and_not_one_row_more() -> None:
    rings = rw.in_process_ranks(producers=1, consumers=1)
    try:
        producer, spec = rings[0].producer(), rings[0].spec
        slot = producer.acquire()
        for tokens, docs in [(spec.max_tokens + 1, 1), (1, spec.max_docs + 1)]:
            with pytest.raises(RingError, match=r"exceeds the slot \(max_tokens=64, max_docs=4"):
                producer.publish(slot, tokens, docs, {"producer": 0, "seq": 0})
        refused = None  # (a failure reported outside the ring's calls reads no unmapped slot)
        try:
            producer.publish(slot, spec.max_tokens, spec.max_docs, {"producer": 0, "seq": 0})
        except RingError as exc:
            refused = str(exc)
        assert refused is None, f"a full item was refused: {refused}"
        item = rings[1].consumer().take(timeout=JOIN_S)
        assert (item.num_tokens, item.num_docs) == (spec.max_tokens, spec.max_docs)
    finally:
        rw.close_ranks(rings)


def test_draining_does_not_wait_for_the_slot_the_producer_still_holds() -> None:
    target, drafter = rw.in_process_ranks(producers=1, consumers=1)
    producer = target.producer()
    producer.acquire()  # never published: no consumer will hand it back
    drain = threading.Thread(target=producer.drain, daemon=True)
    try:
        drain.start()
        drain.join(WAKE_S)
        assert not drain.is_alive(), "the drain waits for the slot its producer holds"
    finally:
        drafter.close()  # a drain still waiting ends: every consumer closed (RingClosed)
        drain.join(WAKE_S)
        target.close()


def _read_a_held_slot_after_close(results) -> None:
    """A spawned process: hold a producer's slot, close the ring, read the slot's views."""
    rings = rw.in_process_ranks(producers=1, consumers=1)
    slot = rings[0].producer().acquire()
    rw.write_item(slot, 0, 7, 4, torch.device("cpu"))
    written = {name: view.clone() for name, view in slot.arrays.items()}
    for ring in reversed(rings):
        ring.close(clean=False)
    results.put(all(torch.equal(slot.arrays[name], copy) for name, copy in written.items()))


def test_a_slot_held_past_the_rings_close_stays_readable() -> None:
    """The host segment is unmapped with the last view of it, not under a view a producer
    still holds (reading it then crashed the process: the spawned one's exit code)."""
    results = CTX.Queue()
    proc = CTX.Process(target=_read_a_held_slot_after_close, args=(results,), daemon=True)
    proc.start()
    proc.join(JOIN_S)
    assert proc.exitcode == 0, f"the process ended with {proc.exitcode}"
    assert results.get(timeout=JOIN_S) is True


def test_items_are_taken_in_the_order_they_were_published_across_producers() -> None:
    """The ready FIFO hands out each published slot once, oldest first (a FIFO whose head
    did not advance handed the first slot out again)."""
    rings = rw.in_process_ranks(producers=2, consumers=1)
    try:
        first, second = rings[0].producer(), rings[1].producer()
        consumer = rings[2].consumer()
        for producer, seq in ((first, 0), (first, 1), (second, 0)):
            rw.publish(producer, seq)
        taken = [consumer.take(timeout=JOIN_S) for _ in range(3)]
        assert [(item.producer_rank, item.seq) for item in taken] == [(10, 0), (10, 1), (11, 0)]
    finally:
        rw.close_ranks(rings)


def test_a_taken_slot_goes_back_to_the_producer_that_owns_it() -> None:
    """Each producer has one slot: once the consumer took the second producer's item,
    that producer (not the first) may write again."""
    rings = rw.in_process_ranks(producers=2, consumers=1, slots_per_producer=1)
    try:
        first, second = rings[0].producer(), rings[1].producer()
        rw.publish(first, 0)
        rw.publish(second, 0)
        consumer = rings[2].consumer()
        assert consumer.take(timeout=JOIN_S).producer_rank == 10
        assert consumer.take(timeout=JOIN_S).producer_rank == 11
        for producer in (second, first):
            error = _raised_within(WAKE_S, lambda p=producer: p.acquire(timeout=1.0))
            assert error is None, f"producer {producer.index} got no slot back: {error}"
    finally:
        rw.close_ranks(rings)
