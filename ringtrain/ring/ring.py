"""The ring protocol: slots passed from producer ranks to consumer ranks.

Objects of run R (see names.py): control block `/ringtrain.R.ctl` (layout in
control.py), host payload `/ringtrain.R.data` (host transport only), one `free`
semaphore per producer (initial value = its slot count), one shared `ready` semaphore
(initial 0), and a lock file whose `fcntl.lockf` lock guards the ready FIFO.

Slot life cycle (each producer owns slots_per_producer slots: RingSpec.slot_owner):

    FREE --acquire--> WRITING --publish--> READY --take--> READING --copied--> FREE

Producer p, `acquire()`: wait on free[p]; the wait guarantees one of p's slots is FREE
(only p moves its slots out of FREE, consumers move them back before releasing
free[p]). Mark it WRITING with its sequence number (its owner is fixed at creation), and
hand out views of its payload memory. `publish()`: make the payload writes visible (host:
synchronise the producer's stream; device: record the slot's interprocess CUDA event
on it), store the descriptor (sizes, meta; msgpack in a fixed-size field), mark READY,
append the slot index to the FIFO under the lock, then release `ready`.

Consumer, `take()`: wait on `ready`, pop one index from the FIFO under the lock, mark
it READING, copy the payload into the consumer's own buffer and then mark it FREE and
release free[owner]. The copy is one contiguous prefix of the slot (the small arrays,
then the rows in use of the last, big one; spec.SlotLayout) into a buffer laid out the same way. On
CPU the copy is a memcpy and the slot is freed at once. On CUDA the copy is queued on
the consumer's current stream (after the slot's event for the device transport; in
stream order after the kernels that may still read the previous item, and before
those that use this one, so no host sync), an event recorded after it, and the slot
is freed once that event completed: by a later take() that finds the copy done (an
event query, no host wait, so the copies of several items queue back to back), by a
take() waiting for an item (the same query while it spins; when a spin ends, a host
wait for the oldest copy only, after which it spins again, so the queued copies keep
the GPU busy while producers refill; it sleeps only with no copy in flight), or at
close.

Semaphore operations are the memory barriers between payload writes and reads. The
semaphores, the FIFO and every wait (a short spin, then sleep) belong to one HandOff
per rank (handoff.py), which the Producer and Consumer ends (ends.py) move slots through.

End of stream: `finish()` marks the producer FINISHED and releases `ready` once. A
consumer that gets a token but finds the FIFO empty returns None if every producer
finished (and releases `ready` again so the next consumer wakes too), else waits on.
Tokens released = items + finishes, and a consumer only discards a token while some
producer is unfinished, so at least one token is always left for the final wake-up.

Liveness: each rank beats its heartbeat from a daemon thread about once a second, which
also samples whether the main thread works, and its main thread publishes progress and
its phase in the rank's own row (own_row.py; the rules: phases.py). Every blocking wait lasts at
most `wait_timeout_s`; then the peers are checked (watch.py): a rank whose pid is gone (or reused:
kernel start time differs, or is a zombie), whose heartbeat is older than `heartbeat_timeout_s`,
that recorded an error, or that set the ring's closing flag raises PeerDied naming that rank, its
label and its last error; one that neither progressed nor worked for longer than its phase
allows raises RankHung, naming what it was doing and where. A watchdog thread runs the
same checks, and checks its own rank too. A slot held by a rank that died mid-write or mid-read is
not recovered: the run treats any dead rank as fatal, so survivors raise PeerDied within one wait
timeout. POSIX semaphores survive their holders, so they are counters only.

Lifetime: local rank 0 `create()`s (after removing objects of dead runs and checking
/dev/shm space); the others `attach()` by run id after a barrier; after a second
barrier `unlink()` removes every name, so a crash leaks nothing in /dev/shm (the
mappings and open descriptors keep the objects alive until the last process exits).
`ringtrain-stat` finds rings through /proc/<pid>/fd and maps them read-only.
"""

from __future__ import annotations

import logging
import mmap
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any

import posix_ipc
import torch

from ringtrain.ring import control as cb
from ringtrain.ring.ends import Consumer, Producer
from ringtrain.ring.errors import PeerDied, RingClosed, RingError
from ringtrain.ring.handoff import HandOff
from ringtrain.ring.names import (
    check_shm_space,
    clean_stale,
    ctl_name,
    free_sem_name,
    lock_path,
    ready_sem_name,
    remove_run,
    shm_path,
)
from ringtrain.ring.own_row import OwnRow
from ringtrain.ring.payload import (
    TRANSPORTS,
    Payload,
    resolve_transport,
    transport_code,
    transport_name,
)
from ringtrain.ring.snapshot import RingSnapshot, take_snapshot
from ringtrain.ring.spec import RingSpec, SlotLayout
from ringtrain.ring.watch import Watch, heartbeat_interval_s

log = logging.getLogger(__name__)
# Every ring this process opened (a stop request during start-up leaves them: open_rings).
_OPENED: weakref.WeakSet[Ring] = weakref.WeakSet()


def open_rings() -> list[Ring]:
    """The rings this process opened and still holds."""
    return list(_OPENED)


def shm_bytes(spec: RingSpec, transport: str) -> int:
    """Bytes the ring takes in /dev/shm: its control block, plus the slots on the host transport."""
    data_bytes = TRANSPORTS[transport].shm_bytes(spec, SlotLayout.of(spec))
    return cb.ControlLayout(spec).total_bytes + data_bytes


class Ring:
    """One process's handle on the node's ring (see the module docstring for the protocol)."""

    def __init__(self, spec: RingSpec, local_index: int, device: torch.device) -> None:
        """Open every object of an existing ring; use create() / attach() instead."""
        if not 0 <= local_index < spec.num_ranks:
            raise RingError(
                f"local index {local_index} is outside the ring's {spec.num_ranks} ranks"
            )
        self.spec, self.local_index, self.device = spec, local_index, device
        # False for a producer group's non-lead members: they attach, own no slots.
        self.is_producer = local_index in spec.producers
        self.layout = SlotLayout.of(spec)
        self._shm = posix_ipc.SharedMemory(ctl_name(spec.run_id))
        self._mm = mmap.mmap(self._shm.fd, self._shm.size)
        self.control = cb.ControlBlock(self._mm, spec)
        self.transport = transport_name(int(self.control.header["transport"]))
        self.handoff = HandOff(spec, self.control, local_index, self.check_peers)
        self.payload = self._open_payload()
        # What this rank publishes about itself: progress, phase, error, GPU busy share.
        self.own_row = OwnRow(self.control.ranks[local_index])
        self._closed = False
        self._close_lock = threading.Lock()
        self._marked_closed = threading.Event()  # the first close stopped the threads
        self._owner_thread = threading.get_ident()
        self.watch = Watch(spec, self.control, local_index)
        self._producer: Producer | None = None
        self._consumer: Consumer | None = None
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        # The watchdog's reaction to a peer's failure, and the lock that lets it run once
        # (the watchdog and a stop signal's thread may both find the failure).
        self._on_dead: Callable[[PeerDied], None] | None = None
        self._reacting = threading.Lock()
        where = f"ring index {local_index} (rank {spec.global_ranks[local_index]})"
        self.own_row.register(where, device)
        _OPENED.add(self)
        self._start_thread(self._heartbeat_loop, "ring-heartbeat")

    # ---- lifetime -------------------------------------------------------------------

    @classmethod
    def create(cls, spec: RingSpec, local_index: int, device: torch.device | str) -> Ring:
        """Create the ring's objects (local rank 0): clean stale runs, check /dev/shm, attach."""
        device = torch.device(device)
        clean_stale(spec.run_id, spec.lock_dir)
        transport, reason = resolve_transport(spec.transport, device)
        layout = cb.ControlLayout(spec)
        slot_layout = SlotLayout.of(spec)
        check_shm_space(shm_bytes(spec, transport))
        encoded = spec.encode()
        if len(encoded) > cb.SPEC_BYTES:
            raise RingError(
                f"ring spec encodes to {len(encoded)} bytes, over {cb.SPEC_BYTES}: too many ranks"
            )
        shm = posix_ipc.SharedMemory(
            ctl_name(spec.run_id), posix_ipc.O_CREX, mode=0o600, size=layout.total_bytes
        )
        try:
            with mmap.mmap(shm.fd, layout.total_bytes) as mm:
                cb.init_control(mm, spec, transport_code(transport), reason, encoded)
            fd = os.open(
                lock_path(spec.lock_dir, spec.run_id), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600
            )
            os.close(fd)
            posix_ipc.Semaphore(ready_sem_name(spec.run_id), posix_ipc.O_CREX, 0o600, 0).close()
            for p in range(len(spec.producers)):
                posix_ipc.Semaphore(
                    free_sem_name(spec.run_id, p), posix_ipc.O_CREX, 0o600, spec.slots_per_producer
                ).close()
            TRANSPORTS[transport].create(spec, slot_layout)
        except BaseException:
            remove_run(spec.run_id, spec.lock_dir)
            raise
        finally:
            shm.close_fd()
        log.info("ring %s: %s transport (%s)", spec.run_id, transport, reason)
        return cls(spec, local_index, device)

    @staticmethod
    def check_space(spec: RingSpec, device: torch.device | str) -> None:
        """Raise ShmTooSmall unless /dev/shm can hold the ring `spec` created on `device`.

        Cheap and side-effect free: for validating inputs before any process starts work.
        """
        transport, _ = resolve_transport(spec.transport, torch.device(device))
        check_shm_space(shm_bytes(spec, transport))

    @classmethod
    def attach(cls, run_id: str, local_index: int, device: torch.device | str) -> Ring:
        """Open the ring `run_id` created by local rank 0 (call after a barrier)."""
        name = ctl_name(run_id)
        try:
            shm = posix_ipc.SharedMemory(name)
        except posix_ipc.ExistentialError:
            raise RingError(
                f"ring {run_id!r} does not exist ({shm_path(name)} missing): local rank 0 must "
                f"create it before the other ranks attach, and nobody may unlink it before"
            ) from None
        try:
            with mmap.mmap(shm.fd, shm.size, prot=mmap.PROT_READ) as mm:
                spec = cb.ControlBlock.read_spec(mm, shm_path(name))
        finally:
            shm.close_fd()
        return cls(spec, local_index, torch.device(device))

    def unlink(self) -> None:
        """Remove every name of this ring (idempotent; mappings stay valid)."""
        try:
            ours = os.fstat(self._shm.fd).st_ino
            named = os.stat(shm_path(ctl_name(self.spec.run_id))).st_ino
        except OSError:
            return
        if ours == named:
            remove_run(self.spec.run_id, self.spec.lock_dir)

    def close(self, clean: bool = True) -> None:
        """Leave the ring: mark clean exit or failure, stop threads, unregister, unmap.

        An unclean close sets the ring's closing flag and wakes every waiter, so the
        other ranks raise PeerDied at once. Also unlinks the names (idempotent). Called
        from another thread than the one that opened the ring (e.g. a watchdog callback
        or a stop signal in start-up, about to exit the process), it only marks, wakes and
        unlinks (no drain): the opening thread may still be inside a wait, so mappings and
        semaphores stay until process exit.
        """
        with self._close_lock:
            first = not self._closed
            self._closed = self.own_row.closed = True
        if first:
            self._mark_closed(clean)
            self._marked_closed.set()
        if threading.get_ident() == self._owner_thread and self.own_row.row is not None:
            # Another thread may be closing first: its threads (the heartbeat) still read
            # the control block until it has stopped them.
            self._marked_closed.wait()
            self._release()

    def _mark_closed(self, clean: bool) -> None:
        """Record the exit in the rank table, wake waiters if unclean, stop threads, unlink."""
        owner = threading.get_ident() == self._owner_thread
        if self.is_producer and clean:
            self.handoff.finish()
        drains = self.payload is not None and self.payload.frees_slots_on_close
        if clean and owner and self._producer is not None and drains:
            self._drain(self._producer)
        if self._consumer is not None and owner:
            self._consumer.release_copied()
        self.own_row.row["status"] = cb.CLOSED if clean else cb.FAILED
        if not clean:
            self.control.header["closing_rank"] = self.local_index
            self.control.closing[...] = 1
            self.handoff.wake_all()
        self._stop.set()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join()
        self.unlink()

    def _drain(self, producer: Producer) -> None:
        """Let consumers copy every published slot out of this producer's GPU slab.

        Every consumer closing cleanly ends the wait quietly: that is how a run ends (the
        consumers finished their work; nobody reads what is left in the ring). A dead or
        failed consumer ends it with a warning (the slab is freed anyway; the failure is
        reported by the peers).
        """
        try:
            producer.drain()
        except RingClosed:
            log.info(
                "ring %s: every consumer closed; the items they did not take go with the slab",
                self.spec.run_id,
            )
        except RingError as exc:
            log.warning("ring %s: closing before consumers drained: %s", self.spec.run_id, exc)

    def _open_payload(self) -> Payload | None:
        """The slots' memory; none for a rank that is neither producer nor consumer (a
        producer group's non-lead member), which writes no slot (so it neither maps nor pins
        the host segment nor imports device slabs)."""
        if not self.is_producer and self.local_index not in self.spec.consumers:
            return None
        return TRANSPORTS[self.transport](self.spec, self.layout, self.device, self.control)

    def _release(self) -> None:
        """Unregister, drop views, unmap and close descriptors (opening thread only)."""
        if self.payload is not None:
            self.payload.close()
        self.control.drop()
        self.own_row.drop()
        try:
            self._mm.close()
        except BufferError:
            log.debug("control block still referenced; unmapped when the views go")
        self._shm.close_fd()
        self.handoff.close()

    # ---- liveness and statistics ---------------------------------------------------

    def _start_thread(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def _heartbeat_loop(self) -> None:
        interval = heartbeat_interval_s(self.spec)
        while not self._stop.wait(interval):
            self.watch.beat(self._closed)

    def gpu_busy_by_rank(self) -> dict[int, float]:
        """The last GPU busy fraction each rank published (ranks that measured one)."""
        values = self.control.ranks["gpu_busy"]
        return {self.spec.global_ranks[i]: float(v) for i, v in enumerate(values) if float(v) >= 0}

    def consumer_step(self) -> int:
        """The highest count any consumer rank has recorded (OwnRow.record_progress; for
        a trainer, its consumers' training step)."""
        steps = self.control.ranks["step"]
        return max(int(steps[i]) for i in self.spec.consumers)

    def fail(self, text: str) -> None:
        """Record `text` as this rank's error and leave the ring failed: every peer stops."""
        self.own_row.set_error(text)
        self.close(clean=False)

    def check_peers(self) -> None:
        """Raise PeerDied if another rank died, failed, aborted the ring or is hung
        (RankHung; a frozen one is killed first: see watch.py)."""
        self.watch.check_peers()

    def start_watchdog(
        self, on_dead: Callable[[PeerDied], None], check_more: Callable[[], None] | None = None
    ) -> None:
        """Check the peers and this rank's own progress every wait_timeout_s in a daemon
        thread; call on_dead once on a death or a hang (of a peer or of this rank), or
        when ``check_more`` (the caller's own check, e.g. that its launcher lives) raises
        PeerDied."""

        self._on_dead = on_dead

        def watch() -> None:
            while not self._stop.wait(self.spec.wait_timeout_s):
                try:
                    if check_more is not None:
                        check_more()
                    self.watch.check_self()  # a hung rank names itself, not its echoes
                    self.watch.check_peers()
                    self.watch.note_slow_self()
                except PeerDied as exc:
                    self._react(exc)
                    return

        self._start_thread(watch, "ring-watchdog")

    def react_to_peer_failure(self) -> None:
        """Look for a peer's death, failure or hang now and, where there is one, react as
        the watchdog does (its on_dead, once per ring; it ends the process): a stop the
        launcher sends because a rank died is then reported as that death. Nothing
        without a watchdog or a failure; once the ring is closed (its control block may be
        unmapped), only a failure a check found before."""
        if self._on_dead is None:
            return
        with self._close_lock:  # the opening thread unmaps the control block once closed
            if self._closed:
                failure = self.watch.found
            else:
                try:
                    self.watch.check_peers()
                    return
                except PeerDied as exc:
                    failure = exc
        if failure is not None:
            self._react(failure)

    def _react(self, exc: PeerDied) -> None:
        """on_dead(exc), by one thread only: another that found the failure too waits
        here while on_dead ends the process."""
        assert self._on_dead is not None
        with self._reacting:
            self._on_dead(exc)

    def snapshot(self) -> RingSnapshot:
        """Statistics of the whole ring as `ringtrain-stat` shows them."""
        return take_snapshot(self.control, self.spec)

    # ---- ends ----------------------------------------------------------------------

    def producer(self) -> Producer:
        """The producer end (producer-end ranks that lead their group only)."""
        if not self.is_producer:
            raise RingError(
                f"ring index {self.local_index} ({self.spec.describe(self.local_index)}) is "
                "not a producer: no producer()"
            )
        if self._producer is None:
            self._producer = Producer(self.handoff, self.payload)
        return self._producer

    def consumer(
        self, device: torch.device | str | None = None, meta_type: Any = dict[str, int]
    ) -> Consumer:
        """The consumer end (consumer-end ranks only), with buffers on `device` (default: the
        ring's), decoding what producers publish with each item as `meta_type`."""
        if self.local_index not in self.spec.consumers:
            raise RingError(
                f"ring index {self.local_index} ({self.spec.describe(self.local_index)}) is "
                "not a consumer: no consumer()"
            )
        if self._consumer is None:
            self._consumer = Consumer(
                self.handoff,
                self.payload,
                torch.device(device) if device is not None else self.device,
                meta_type,
            )
        return self._consumer
