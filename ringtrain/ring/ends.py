"""The two ends of the ring: the Producer and the Consumer.

They follow the protocol documented in ring.py (slot life cycle, semaphores, FIFO);
this module holds their side of it: views of a slot, descriptors, and the copies. Slots
move between them only through the rank's HandOff (handoff.py); the Ring hands each end
the parts it uses, so the ends know nothing of the ring's lifetime.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import msgspec
import torch

from ringtrain.named_arrays import NamedArrays
from ringtrain.ring import control as cb
from ringtrain.ring.errors import RingError
from ringtrain.ring.handoff import HandOff
from ringtrain.ring.payload import Payload
from ringtrain.ring.spec import SlotLayout

# Consumers cache (buffer, payload) views per (slot, tokens, docs); shapes are bucketed.
VIEW_CACHE_SIZE = 4096


@dataclass
class WriteSlot(NamedArrays):
    """A slot a producer holds between acquire() and publish(): views into payload memory
    of each field of the spec, at full capacity (`slot.arrays[name]`, or `slot.name`)."""

    index: int
    arrays: dict[str, torch.Tensor]


@dataclass
class ReadItem(NamedArrays):
    """One item in the consumer's own buffers, valid until its next take(): the rows it
    uses of each field of the spec (`item.arrays[name]`, or `item.name`).

    On CUDA, use it on the stream that was current during take() (the copy is queued on
    that stream); another stream must first wait_stream() on it.
    """

    arrays: dict[str, torch.Tensor]
    num_tokens: int
    num_docs: int
    meta: Any  # what the producer published with it, decoded as the consumer's meta_type
    producer_rank: int
    seq: int


@dataclass
class _ItemCopy:
    """A consumer's views of its buffer for one item shape, and the copy that fills them."""

    views: dict[str, torch.Tensor]
    destination: torch.Tensor
    source: torch.Tensor


class Producer:
    """Writes items into this producer's own slots (see the module docstring)."""

    def __init__(self, handoff: HandOff, payload: Payload) -> None:
        self._handoff, self._payload = handoff, payload
        self.spec, self._control = handoff.spec, handoff.control
        self._local_index = handoff.local_index
        self.index = self.spec.producers.index(self._local_index)
        self._seq = 0
        self._encode = msgspec.msgpack.Encoder().encode
        payload.open_producer(self._local_index, self.index)
        self._slots = [
            WriteSlot(index=g, arrays=payload.writer_views(g))
            for g in self.spec.producer_slots(self.index)
        ]
        self._pending: WriteSlot | None = None

    def acquire(self, timeout: float | None = None) -> WriteSlot:
        """Block until one of this producer's slots is free (peers checked while waiting)."""
        if self._pending is not None:
            raise RingError("acquire() called twice without publish(): publish the held slot first")
        self._handoff.wait_free(self.index, timeout, "a free slot")
        self._handoff.check_open()
        states = self._control.slot_state
        for slot in self._slots:
            if int(states[slot.index]) == cb.FREE:
                break
        else:
            raise RingError(f"producer {self.index}: free semaphore granted but no slot is FREE")
        self._control.slot["seq"][slot.index] = self._seq
        states[slot.index] = cb.WRITING
        self._pending = slot
        return slot

    def publish(self, slot: WriteSlot, num_tokens: int, num_docs: int, meta: Any) -> None:
        """Hand the slot to the consumers: `num_tokens` rows, `num_docs` documents, `meta`.

        `meta` is anything msgpack encodes (a msgspec Struct, a dict of ints) that fits
        the slot's descriptor; consumers decode it as their `meta_type`."""
        spec, control = self.spec, self._control
        if slot is not self._pending:
            raise RingError(f"publish() of slot {slot.index}, which this producer does not hold")
        if not (0 <= num_tokens <= spec.max_tokens and 0 <= num_docs <= spec.max_docs):
            raise RingError(
                f"publish(num_tokens={num_tokens}, num_docs={num_docs}) exceeds the slot "
                f"(max_tokens={spec.max_tokens}, max_docs={spec.max_docs})"
            )
        self._payload.after_write(slot.index)
        try:
            control.write_desc(slot.index, self._encode((num_tokens, num_docs, meta)))
        except ValueError as exc:
            raise RingError(f"publish(): meta {meta} is too large: {exc}") from None
        control.slot_state[slot.index] = cb.READY
        self._pending = None
        self._seq += 1
        self._handoff.hand_over(slot.index)
        control.rank["items"][self._local_index] += 1

    def finish(self) -> None:
        """No more items from this producer; consumers drain the FIFO and then see None."""
        self._handoff.finish()

    def drain(self) -> None:
        """Wait until consumers handed back every slot this producer published.

        A device slab is freed on close, so it must outlive the items still in the FIFO.
        Each free-semaphore token is one slot handed back; a dead or closed consumer ends
        the wait with a RingError.
        """
        for _ in range(len(self._slots) - (self._pending is not None)):
            self._handoff.wait_free(self.index, None, "consumers to drain its slots")


class Consumer:
    """Takes ready slots from any producer into its own preallocated buffers."""

    def __init__(
        self,
        handoff: HandOff,
        payload: Payload,
        device: torch.device,
        meta_type: Any = dict[str, int],
    ) -> None:
        self._handoff, self._payload, self.device = handoff, payload, device
        self.spec, self._control = handoff.spec, handoff.control
        self._local_index = handoff.local_index
        spec = self.spec
        self._layout = SlotLayout.of(spec)
        # One buffer laid out like a slot: one copy of the slot's used prefix brings an item.
        self._buffer = torch.empty(self._layout.slot_bytes, dtype=torch.uint8, device=device)
        self._views = self._layout.views(self._buffer, 0)
        self._cuda = device.type == "cuda"
        self._decode = msgspec.msgpack.Decoder(tuple[int, int, meta_type]).decode
        # The global rank of the producer that owns each slot.
        self._owner_rank = [
            spec.global_ranks[spec.producers[spec.slot_owner(g)[0]]] for g in range(spec.num_slots)
        ]
        self._item_cache: dict[tuple[int, int, int], _ItemCopy] = {}
        # CUDA: slots whose copy is queued, oldest first; each goes back once its copy is
        # seen complete (see ring.py).
        self._copying: deque[tuple[int, torch.cuda.Event]] = deque()
        self._copied = [torch.cuda.Event() for _ in range(spec.num_slots)] if self._cuda else []

    def take(self, timeout: float | None = None) -> ReadItem | None:
        """The next item (copied into this consumer's buffers), or None once all producers
        finished."""
        handoff = self._handoff
        while True:
            handoff.wait_ready(
                timeout, poll=self._release_finished, before_block=self._release_oldest
            )
            handoff.check_open()
            slot = handoff.pop()
            if slot >= 0:
                return self._read(slot)
            if handoff.all_producers_finished():
                self.release_copied()
                handoff.release_ready()
                return None

    def release_copied(self) -> None:
        """Hand back every slot whose copy was queued by earlier take()s (waits for the copies)."""
        while self._release_oldest():
            pass

    def _release_oldest(self) -> bool:
        """Wait for the oldest queued copy and hand its slot back; False if none is queued.

        One slot at a time (not all of them): the later copies keep the GPU busy while
        the producer refills the freed slot."""
        if not self._copying:
            return False
        slot, done = self._copying.popleft()
        done.synchronize()
        self._free_slot(slot)
        return True

    def _release_finished(self) -> None:
        """Hand back the slots whose copies already completed, oldest first, without waiting."""
        while self._copying and self._copying[0][1].query():
            self._free_slot(self._copying.popleft()[0])

    def _free_slot(self, slot: int) -> None:
        self._control.slot_state[slot] = cb.FREE
        self._handoff.give_back(slot)

    def _item_copy(self, slot: int, num_tokens: int, num_docs: int) -> _ItemCopy:
        """The item's views of our buffer and its one copy, cached per (slot, tokens,
        docs): shapes are bucketed, so few keys occur."""
        key = (slot, num_tokens, num_docs)
        entry = self._item_cache.get(key)
        if entry is None:
            if len(self._item_cache) >= VIEW_CACHE_SIZE:
                self._item_cache.clear()
            used = self._layout.used_bytes(num_tokens)
            entry = _ItemCopy(
                views=self._layout.item_views(self._views, num_tokens, num_docs),
                destination=self._buffer[:used],
                source=self._payload.reader_bytes(slot)[:used],
            )
            self._item_cache[key] = entry
        return entry

    def _read(self, slot: int) -> ReadItem:
        ctl = self._control
        ctl.slot_state[slot] = cb.READING
        num_tokens, num_docs, meta = self._decode(ctl.read_desc(slot))
        seq = int(ctl.slot["seq"][slot])
        entry = self._item_copy(slot, num_tokens, num_docs)
        if not self._cuda:
            entry.destination.copy_(entry.source)
            self._free_slot(slot)
        else:
            # Queued on the caller's stream, behind its kernels that may still read the
            # previous item; the item is ready for that stream's later kernels.
            stream = torch.cuda.current_stream(self.device)
            self._payload.before_read(slot, stream)
            entry.destination.copy_(entry.source, non_blocking=True)
            done = self._copied[slot]
            done.record(stream)
            # Slots go back as soon as their copies are seen complete; no host wait here, so
            # the copies of several items can queue back to back.
            self._release_finished()
            self._copying.append((slot, done))
        ctl.rank["items"][self._local_index] += 1
        return ReadItem(
            arrays=entry.views,
            num_tokens=num_tokens,
            num_docs=num_docs,
            meta=meta,
            producer_rank=self._owner_rank[slot],
            seq=seq,
        )
