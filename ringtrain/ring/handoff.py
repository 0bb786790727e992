"""The hand-off of slots between producers and consumers: semaphores, the ready FIFO, waits.

One rank's view of the synchronisation described in ring.py: a `free` semaphore per
producer (a token = one of its slots is FREE), one shared `ready` semaphore (a token =
one index in the FIFO, or one finish), and the ready FIFO in the control block, whose
head and tail are guarded by an `fcntl.lockf` lock (the kernel drops it if its holder
dies). The Producer and Consumer ends (ends.py) move slots only through this object;
the ring (ring.py) owns its lifetime and passes in the peer check that every wait runs
on timeout, so this module imports nothing of the ring's.

Semaphore operations are the memory barriers between writes and reads; nobody spins on
shared flags. A wait that cannot take its semaphore at once retries it without blocking
for up to SPIN_BEFORE_BLOCK_NS before it sleeps, yielding the CPU between retries (so a
spinning rank does not hold up the peer it waits for on a machine with few cores): a
process woken from sleep needs tens of microseconds and at times hundreds on a virtual
machine with idle cores, longer than a whole hand-off between two awake processes. The
spin outlasts the copy of a large item (about 130 us for 256 MiB on an H200), so a
producer waiting for its next free slot does not sleep; with a 50 us spin about one
run in four of tools/bench_ring.py lost 6-10% of the device rate to late wake-ups.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable

import posix_ipc

from ringtrain.ring import control as cb
from ringtrain.ring.errors import RingClosed, RingTimeout
from ringtrain.ring.liveness import monotonic_ns
from ringtrain.ring.names import free_sem_name, lock_path, ready_sem_name
from ringtrain.ring.spec import RingSpec

SPIN_BEFORE_BLOCK_NS = 300_000  # see the module docstring


class HandOff:
    """One rank's semaphores, FIFO lock and waits on the ring `spec` (see the module docstring).

    `check_peers` raises PeerDied when another rank died, failed or aborted the ring; it
    runs whenever a wait times out and after a wait that the ring's closing flag ended.
    """

    def __init__(
        self,
        spec: RingSpec,
        control: cb.ControlBlock,
        local_index: int,
        check_peers: Callable[[], None],
    ) -> None:
        self.spec, self.control, self.local_index = spec, control, local_index
        self._check_peers = check_peers
        self._is_producer = local_index in spec.producers
        self._lock_fd = os.open(lock_path(spec.lock_dir, spec.run_id), os.O_RDWR)
        self._ready = posix_ipc.Semaphore(ready_sem_name(spec.run_id))
        self._free = [
            posix_ipc.Semaphore(free_sem_name(spec.run_id, p)) for p in range(len(spec.producers))
        ]
        self._free_of_slot = [self._free[spec.slot_owner(g)[0]] for g in range(spec.num_slots)]
        self.finished = False

    # ---- producer side ---------------------------------------------------------------

    def wait_free(self, producer: int, timeout: float | None, waits_on: str) -> None:
        """Take one free-slot token of `producer` (time counted as blocked)."""
        self._wait(self._free[producer], "blocked_ns", timeout, waits_on)

    def hand_over(self, slot: int) -> None:
        """Append the READY slot `slot` to the FIFO and wake one consumer."""
        ctl = self.control
        fcntl.lockf(self._lock_fd, fcntl.LOCK_EX)
        try:
            tail = int(ctl.fifo_tail)
            ctl.fifo[tail % self.spec.num_slots] = slot
            ctl.fifo_tail[...] = tail + 1
        finally:
            fcntl.lockf(self._lock_fd, fcntl.LOCK_UN)
        self._ready.release()

    def finish(self) -> None:
        """Mark this producer FINISHED and leave consumers one wake-up token (once)."""
        if self.finished:
            return
        self.control.ranks[self.local_index]["status"] = cb.FINISHED
        self.finished = True
        self._ready.release()

    # ---- consumer side ---------------------------------------------------------------

    def wait_ready(
        self,
        timeout: float | None,
        poll: Callable[[], None] | None = None,
        before_block: Callable[[], bool] | None = None,
    ) -> None:
        """Take one ready token (time counted as starved); see `_wait` for the callbacks."""
        self._wait(self._ready, "starved_ns", timeout, "a ready slot", poll, before_block)

    def pop(self) -> int:
        """Next ready slot index, or -1 when the FIFO is empty."""
        ctl = self.control
        fcntl.lockf(self._lock_fd, fcntl.LOCK_EX)
        try:
            head = int(ctl.fifo_head)
            if head == int(ctl.fifo_tail):
                return -1
            slot = int(ctl.fifo[head % self.spec.num_slots])
            ctl.fifo_head[...] = head + 1
            return slot
        finally:
            fcntl.lockf(self._lock_fd, fcntl.LOCK_UN)

    def give_back(self, slot: int) -> None:
        """Return one free-slot token to the producer that owns `slot` (now FREE)."""
        self._free_of_slot[slot].release()

    def release_ready(self) -> None:
        """Leave one ready token, so the next waiting consumer wakes (end of stream)."""
        self._ready.release()

    def all_producers_finished(self) -> bool:
        """True once every producer finished or closed."""
        status = self.control.ranks["status"]
        return all(int(status[i]) in (cb.FINISHED, cb.CLOSED) for i in self.spec.producers)

    # ---- both sides ------------------------------------------------------------------

    def check_open(self) -> None:
        """After a wait: raise PeerDied if the ring is closing because a peer aborted it."""
        if int(self.control.closing):
            self._check_peers()

    def wake_all(self) -> None:
        """Release every waiter of the ring (an unclean close: they see the closing flag)."""
        for _ in self.spec.consumers:
            self._ready.release()
        for sem in self._free:
            for _ in range(self.spec.slots_per_producer):
                sem.release()

    def close(self) -> None:
        """Close the lock file and the semaphores (the opening thread, at ring close)."""
        os.close(self._lock_fd)
        for sem in [self._ready, *self._free]:
            sem.close()

    def _wait(
        self,
        sem: posix_ipc.Semaphore,
        counter: str,
        timeout: float | None,
        waits_on: str,
        poll: Callable[[], None] | None = None,
        before_block: Callable[[], bool] | None = None,
    ) -> None:
        """Acquire `sem`; time spent waiting goes to this rank's `counter` (ns).

        The call and each wake-up refresh this rank's progress (a rank waiting on the
        ring waits on its peers: it is not hung; see phases.py). If the semaphore is not available
        at once, `poll` runs before each retry of the spin (see the module docstring). When a spin
        ends, `before_block` runs; if it returns True (it made progress, e.g. freed a slot) the spin
        starts over, otherwise the wait sleeps on the semaphore.
        """
        progress = self.control.rank["progress_ns"]
        progress[self.local_index] = monotonic_ns()
        try:
            sem.acquire(0)
            return
        except posix_ipc.BusyError:
            pass
        start = monotonic_ns()
        deadline = None if timeout is None else start + int(timeout * 1e9)
        wait_start = self.control.rank["wait_start_ns"]
        wait_start[self.local_index] = start
        try:
            if self._spin(sem, poll, before_block):
                return
            while True:
                try:
                    sem.acquire(self.spec.wait_timeout_s)
                    return
                except (posix_ipc.BusyError, posix_ipc.SignalError):
                    # A signal (SIGTERM from torchrun, handled by the trainer) cuts the wait
                    # short: the process decides at a safe point, the wait goes on.
                    progress[self.local_index] = monotonic_ns()
                    self._check_peers()
                    self._check_consumers_open(waits_on)
                    if deadline is not None and monotonic_ns() >= deadline:
                        raise RingTimeout(
                            f"ring {self.spec.run_id}: "
                            f"rank {self.spec.global_ranks[self.local_index]} "
                            f"waited {timeout} s for {waits_on} (every peer alive)"
                        ) from None
        finally:
            self.control.rank[counter][self.local_index] += monotonic_ns() - start
            wait_start[self.local_index] = 0

    @staticmethod
    def _spin(
        sem: posix_ipc.Semaphore,
        poll: Callable[[], None] | None,
        before_block: Callable[[], bool] | None,
    ) -> bool:
        """Retry `sem` without blocking (see `_wait`); True once it was taken."""
        while True:
            spin_start = monotonic_ns()
            while monotonic_ns() - spin_start < SPIN_BEFORE_BLOCK_NS:
                os.sched_yield()
                if poll is not None:
                    poll()
                try:
                    sem.acquire(0)
                    return True
                except posix_ipc.BusyError:
                    pass
            if before_block is None or not before_block():
                return False

    def _check_consumers_open(self, waits_on: str) -> None:
        """A producer waiting for a slot that no consumer will ever free raises RingClosed.

        (Consumers need no such check: finished or closed producers leave a wake-up token.)
        """
        status = self.control.ranks["status"]
        if self._is_producer and all(int(status[i]) == cb.CLOSED for i in self.spec.consumers):
            raise RingClosed(
                f"ring {self.spec.run_id}: every consumer rank closed while producer rank "
                f"{self.spec.global_ranks[self.local_index]} "
                f"({self.spec.describe(self.local_index)}) waits for {waits_on}"
            )
