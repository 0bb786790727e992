"""Dead peers: survivors raise PeerDied naming the dead rank, its role and its last error."""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import re
import signal
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from ringtrain.ring import PeerDied, Ring, RingClosed
from ringtrain.ring import control as cb
from ringtrain.ring.liveness import process_state
from ringtrain.trainer.outcome import FAILED, read_outcomes
from ringtrain.trainer.signals import STOP_STEPS
from tests.helpers import ring_workers as rw

CTX = mp.get_context("spawn")
JOIN_S = 60
# Survivors must notice within this many seconds (wait_timeout_s is 0.2 in the tests).
DETECT_S = 5.0


def test_consumer_killed_mid_read_fails_producer_and_other_consumer() -> None:
    spec = rw.make_spec(rw.run_id(), producers=1, consumers=2, slots=1)
    barrier, results = CTX.Barrier(3), CTX.Queue()
    reached, go = CTX.Event(), CTX.Event()
    victim = CTX.Process(
        target=rw.rank_main, args=(spec, 1, barrier, results, "hang_mid_read", reached)
    )
    survivor = CTX.Process(target=rw.rank_main, args=(spec, 2, barrier, results, "take_after", go))
    victim.start()
    survivor.start()
    ring = rw.join_ring(spec, 0, barrier)
    try:
        producer = ring.producer()
        slot = producer.acquire()
        rw.write_item(slot, 0, 0, 8, torch.device("cpu"))
        producer.publish(slot, 8, 1, {"producer": 0, "seq": 0})
        assert reached.wait(JOIN_S)
        assert ring.snapshot().slot_states == ["reading"]
        go.set()
        os.kill(victim.pid, signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(PeerDied, match=rf"rank 11 \(drafter, pid {victim.pid}\) died") as info:
            producer.acquire()
        assert time.monotonic() - start < DETECT_S
        assert info.value.rank == 11 and info.value.label == "drafter"
        tag, index, message = results.get(timeout=JOIN_S)
        assert (tag, index) == ("peer_died", 2)
        assert "rank 11 (drafter" in message
        survivor.join(JOIN_S)
        assert survivor.exitcode == 0
    finally:
        ring.close(clean=False)
        victim.join(JOIN_S)


def test_producer_killed_mid_write_fails_consumer() -> None:
    spec = rw.make_spec(rw.run_id(), producers=1, consumers=1, slots=2)
    barrier, results = CTX.Barrier(2), CTX.Queue()
    reached = CTX.Event()
    victim = CTX.Process(
        target=rw.rank_main, args=(spec, 0, barrier, results, "hang_mid_write", reached)
    )
    victim.start()
    ring = rw.join_ring(spec, 1, barrier)
    try:
        consumer = ring.consumer()
        assert reached.wait(JOIN_S)
        assert ring.snapshot().slot_states == ["writing", "free"]
        os.kill(victim.pid, signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(
            PeerDied, match=rf"rank 10 \(target, pid {victim.pid}\) died.*last error: none"
        ):
            consumer.take()
        assert time.monotonic() - start < DETECT_S
    finally:
        ring.close(clean=False)
        victim.join(JOIN_S)


def _pair(heartbeat_timeout_s: float = 30.0) -> tuple[Ring, Ring]:
    spec = rw.make_spec(
        rw.run_id(), producers=1, consumers=1, heartbeat_timeout_s=heartbeat_timeout_s
    )
    first = Ring.create(spec, 0, "cpu")
    return first, Ring.attach(spec.run_id, 1, "cpu")


def test_recorded_error_is_named_and_watchdog_fires_once() -> None:
    target, drafter = _pair()
    try:
        fired: list[PeerDied] = []
        done = threading.Event()

        def on_dead(exc: PeerDied) -> None:
            fired.append(exc)
            target.close(clean=False)  # as a trainer does before exiting; may not join itself
            done.set()

        target.start_watchdog(on_dead)
        drafter.own_row.set_error("CUDA out of memory in drafter step 7")
        assert done.wait(DETECT_S)
        assert len(fired) == 1
        assert "rank 11 (drafter" in str(fired[0])
        assert fired[0].last_error == "CUDA out of memory in drafter step 7"
        with pytest.raises(PeerDied, match="failed; its last error: CUDA out of memory"):
            target.check_peers()
        with pytest.raises(PeerDied, match=r"rank 10 \(target.*aborted the ring"):
            drafter.check_peers()
    finally:
        drafter.close(clean=False)
        target.close(clean=False)


def test_a_frozen_peer_is_killed_once_and_every_check_blames_it_alike() -> None:
    """The rank that finds a peer frozen records it in the peer's row, then kills it: both
    of its threads that check (watchdog and main) report the one failure it saw, with
    primary set; another rank, which then finds the process gone, reads the record and
    blames the frozen rank without claiming to have seen it die."""
    spec = rw.make_spec(rw.run_id(), producers=1, consumers=2, heartbeat_timeout_s=2.0)
    barrier, results, attached = CTX.Barrier(2), CTX.Queue(), CTX.Event()
    frozen = CTX.Process(
        target=rw.rank_main, args=(spec, 2, barrier, results, "wait_for_kill", attached)
    )
    frozen.start()
    target = Ring.create(spec, 0, "cpu")
    drafter = Ring.attach(spec.run_id, 1, "cpu")
    barrier.wait()
    barrier.wait()
    try:
        assert attached.wait(JOIN_S)
        os.kill(frozen.pid, signal.SIGSTOP)
        deadline = time.monotonic() + JOIN_S
        while process_state(frozen.pid) not in ("T", "t"):  # its heartbeat thread stopped
            assert time.monotonic() < deadline, "the SIGSTOPped rank never stopped"
        target.control.ranks["heartbeat_ns"][2] = time.monotonic_ns() - 10**10
        seen: list[PeerDied] = []

        def check() -> None:
            with pytest.raises(PeerDied) as info:
                target.check_peers()
            seen.append(info.value)

        checks = [threading.Thread(target=check) for _ in range(2)]
        for thread in checks:
            thread.start()
        for thread in checks:
            thread.join(JOIN_S)
        assert len(seen) == 2 and seen[0] is seen[1]
        assert f"rank 12 (drafter, pid {frozen.pid}) stopped beating" in str(seen[0])
        assert "its process is stopped" in str(seen[0]) and seen[0].primary
        frozen.join(JOIN_S)
        assert frozen.exitcode == -signal.SIGKILL
        with pytest.raises(
            PeerDied, match=r"rank 12 .*\) failed; its last error: stopped bea"
        ) as info:
            drafter.check_peers()
        assert "rank 10 killed it" in str(info.value) and not info.value.primary
    finally:
        if frozen.is_alive():
            frozen.kill()
        drafter.close(clean=False)
        target.close(clean=False)


def test_unclean_close_wakes_a_blocked_waiter_at_once() -> None:
    target, drafter = _pair()
    try:
        consumer = drafter.consumer()
        outcome: list[BaseException] = []

        def take() -> None:
            try:
                consumer.take()
            except PeerDied as exc:
                outcome.append(exc)

        thread = threading.Thread(target=take)
        thread.start()
        target.close(clean=False)
        thread.join(DETECT_S)
        assert outcome and "rank 10 (target" in str(outcome[0])
    finally:
        drafter.close(clean=False)


def test_stale_heartbeat_counts_as_dead() -> None:
    target, drafter = _pair(heartbeat_timeout_s=2.0)
    try:
        drafter.control.rank["heartbeat_ns"][1] = time.monotonic_ns() - 10**10
        target.control.rank["heartbeat_ns"][1] = time.monotonic_ns() - 10**10
        with pytest.raises(PeerDied, match=r"rank 11 \(drafter.*stopped beating"):
            target.check_peers()
    finally:
        drafter.close()
        target.close()


def test_producer_waiting_on_closed_consumers_raises_ring_closed() -> None:
    target, drafter = _pair()
    try:
        producer = target.producer()
        for seq in range(2):
            slot = producer.acquire()
            producer.publish(slot, 0, 0, {"seq": seq})
        drafter.close(clean=True)
        with pytest.raises(RingClosed, match="every consumer rank closed"):
            producer.acquire()
    finally:
        target.close()


def test_draining_after_a_clean_end_is_quiet_and_after_a_failure_warns(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A device slab waits for its items to be read before it is freed (Ring.close): when
    every drafter closed cleanly that wait ends the run quietly; a failed drafter warns."""
    for drafter_ends, warned in [("closes", False), ("fails", True)]:
        target, drafter = _pair()
        try:
            producer = target.producer()
            for seq in range(2):
                producer.publish(producer.acquire(), 0, 0, {"seq": seq})
            if drafter_ends == "closes":
                drafter.close(clean=True)
            else:
                drafter.own_row.set_error("boom")
            caplog.clear()
            with caplog.at_level(logging.INFO, logger="ringtrain.ring"):
                target._drain(producer)
            warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
            assert bool(warnings) == warned, warnings
            if warned:
                assert "closing before consumers drained" in warnings[0] and "boom" in warnings[0]
        finally:
            drafter.close(clean=drafter_ends == "closes")
            target.close()


@pytest.mark.parametrize("peer_killed", [True, False], ids=["peer-killed", "peers-alive"])
def test_a_stop_during_start_up_after_a_peer_died_reports_the_death(peer_killed: bool) -> None:
    """A launcher stops every rank when one dies. A rank still starting (nothing trained)
    that gets that SIGTERM before its watchdog's next look reports the death (exit 1,
    naming the dead rank) rather than a stop; with every peer alive it leaves as stopped
    (128 + SIGTERM)."""
    # The watchdog's next look lies far ahead: the stop's thread is the one to find it.
    spec = replace(rw.make_spec(rw.run_id(), producers=1, consumers=1), wait_timeout_s=120.0)
    # The peer has a queue of its own: a process killed just after its put may still hold
    # a queue's shared write lock, which would then block the rank's report for good.
    barrier, results, peer_results = CTX.Barrier(2), CTX.Queue(), CTX.Queue()
    peer = CTX.Process(target=rw.idle_rank, args=(spec, 0, barrier, peer_results))
    rank = CTX.Process(target=rw.start_up_rank, args=(spec, 1, barrier, results))
    peer.start()
    rank.start()
    try:
        assert peer_results.get(timeout=JOIN_S)[:2] == ("ready", 0)
        assert results.get(timeout=JOIN_S)[:2] == ("ready", 1)
        if peer_killed:
            os.kill(peer.pid, signal.SIGKILL)
            peer.join(JOIN_S)
        os.kill(rank.pid, signal.SIGTERM)
        rank.join(JOIN_S)
        if peer_killed:
            assert rank.exitcode == 1
            tag, index, message = results.get(timeout=JOIN_S)
            assert (tag, index) == ("peer_died", 1)
            assert f"rank 10 (target, pid {peer.pid}) died" in message
        else:
            assert rank.exitcode == 128 + signal.SIGTERM
    finally:
        for process in (peer, rank):
            process.kill()
            process.join(JOIN_S)


def test_a_stop_during_start_up_leaves_the_ring_cleanly() -> None:
    """A rank stopped in start-up closes its ring cleanly on its way out (128 + SIGTERM):
    its peers see a rank that left, not one that failed."""
    spec = replace(rw.make_spec(rw.run_id(), producers=1, consumers=1), wait_timeout_s=120.0)
    barrier, results = CTX.Barrier(2), CTX.Queue()
    rank = CTX.Process(target=rw.start_up_rank, args=(spec, 1, barrier, results))
    rank.start()
    ring = rw.join_ring(spec, 0, barrier)
    try:
        assert results.get(timeout=JOIN_S)[:2] == ("ready", 1)
        os.kill(rank.pid, signal.SIGTERM)
        rank.join(JOIN_S)
        assert rank.exitcode == 128 + signal.SIGTERM
        ring.check_peers()  # no PeerDied
        assert int(ring.control.rank["status"][1]) == cb.CLOSED
    finally:
        rank.kill()
        rank.join(JOIN_S)
        ring.close()


def test_a_stop_in_training_that_never_reaches_a_safe_point_fails_after_its_bound(
    tmp_path: Path,
) -> None:
    """SIGTERM to a training rank whose step never ends: the rank waits STOP_STEPS times
    its longest step plus ring.startup_timeout_s for its safe point, then leaves as failed
    (exit 1), naming that bound in its outcome and to its peers."""
    spec = replace(rw.make_spec(rw.run_id(), producers=1, consumers=1), startup_timeout_s=1.0)
    barrier, results = CTX.Barrier(2), CTX.Queue()
    rank = CTX.Process(target=rw.stuck_in_training, args=(spec, 1, barrier, results, str(tmp_path)))
    rank.start()
    ring = rw.join_ring(spec, 0, barrier)
    try:
        assert results.get(timeout=JOIN_S)[:2] == ("ready", 1)
        signalled = time.monotonic()
        os.kill(rank.pid, signal.SIGTERM)
        rank.join(JOIN_S)
        waited_s = time.monotonic() - signalled
        # The step as measured is STEP_S or a little more under load.
        bound_s = STOP_STEPS * rw.STEP_S + spec.startup_timeout_s
        assert rank.exitcode == 1 and waited_s >= bound_s
        [outcome] = read_outcomes(tmp_path)
        assert outcome.kind == FAILED and outcome.code == 1
        said = re.match(
            r"rank 0 did not reach a safe point within (\d+) s of SIGTERM \((\d+) x its longest "
            r"step, (\d+) s, \+ ring\.startup_timeout_s for the checkpoint\)",
            outcome.message,
        )
        assert said, outcome.message
        within_s, steps, step_s = map(int, said.groups())
        assert (steps, step_s) == (STOP_STEPS, rw.STEP_S)
        assert round(bound_s) <= within_s <= waited_s + 0.5
        with pytest.raises(PeerDied, match="did not reach a safe point") as failure:
            ring.check_peers()
        assert failure.value.last_error == outcome.message
    finally:
        rank.kill()
        rank.join(JOIN_S)
        ring.close()


@pytest.mark.parametrize("found_before", [True, False], ids=["found-before", "nothing-found"])
def test_a_stop_after_the_ring_was_closed_reads_no_unmapped_memory(found_before: bool) -> None:
    """A launcher's SIGTERM may reach a rank whose main thread already failed and closed
    (unmapped) its ring: the reaction reports only what a check found before, and reads
    nothing of the ring's shared memory."""
    spec = replace(rw.make_spec(rw.run_id(), producers=1, consumers=1), wait_timeout_s=120.0)
    target = Ring.create(spec, 0, "cpu")
    drafter = Ring.attach(spec.run_id, 1, "cpu")
    fired: list[PeerDied] = []
    target.start_watchdog(fired.append)
    drafter.own_row.set_error("CUDA out of memory")
    drafter.close(clean=False)
    if found_before:
        with pytest.raises(PeerDied, match="aborted the ring"):
            target.check_peers()
    target.close(clean=False)  # the opening thread: the control block is unmapped
    target.react_to_peer_failure()
    if found_before:
        [failure] = fired
        assert f"rank 11 (drafter, pid {os.getpid()}) aborted the ring" in str(failure)
        assert failure.last_error == "CUDA out of memory"
    else:
        assert fired == []


def test_a_stop_after_the_rank_said_how_it_ends_leaves_its_exit_alone() -> None:
    """The launcher stops the other ranks once one exits; a rank already on its way out
    with its outcome said keeps its exit code rather than leaving as stopped (143)."""
    results = CTX.Queue()
    rank = CTX.Process(target=rw.stop_after_the_outcome, args=(results,))
    rank.start()
    rank.join(JOIN_S)
    assert rank.exitcode == 0
    assert results.get(timeout=JOIN_S) == "returned"
