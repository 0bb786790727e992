"""The target rank's loop: batches in, forward passes, tapped hidden states into the ring.

Each iteration takes a free slot of this producer, runs the target forward with the
hooks writing the tapped layers straight into the slot, fills in the token arrays and
publishes the slot. The next batch's host-to-device copy is started while the current
forward runs. Held-out batches are inserted when evaluation is due (trainer/heldout.py).
The loop ends when the ring closes (the drafters are done) or on SIGTERM.

A tensor-parallel target group runs this loop on every member: the lead takes and
publishes the slots and decides each iteration, the other members follow its decision
(trainer/target_group.py) and write their identical taps into a scratch buffer.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

import numpy as np
import torch

from ringtrain.batch import HIDDEN, TOKEN_ARRAYS
from ringtrain.data import Batch, BatchStream
from ringtrain.ring import Ring, RingClosed
from ringtrain.ring.ends import Producer, WriteSlot
from ringtrain.target import TargetRunner
from ringtrain.trainer import phases
from ringtrain.trainer.batch_meta import BatchKind, BatchMeta
from ringtrain.trainer.gpu_busy import GpuBusySampler
from ringtrain.trainer.heldout import EvalSchedule, others_published
from ringtrain.trainer.logs import get_logger
from ringtrain.trainer.signals import StopRequest
from ringtrain.trainer.target_group import Decision, GroupDecisions
from ringtrain.trainer.target_progress import TargetProgress


def _fill(view: torch.Tensor, values: np.ndarray) -> None:
    view[: len(values)].copy_(torch.from_numpy(values), non_blocking=True)


class BatchOrder:
    """A producer's batches in production order: training batches, with its held-out shard
    inserted whenever an evaluation round is due (decided by the group's lead)."""

    def __init__(self, stream: BatchStream, schedule: EvalSchedule | None) -> None:
        self.stream, self.schedule = stream, schedule
        self._round: Iterator[tuple[Batch, int]] | None = None

    def eval_due(self, others_published: int) -> bool:
        """Whether the next round's batches go next (EvalSchedule.due)."""
        return self.schedule is not None and self.schedule.due(others_published)

    def next(self, eval_due: bool) -> tuple[Batch, BatchKind, int]:
        """(batch, kind, eval round) to produce next; `eval_due` starts a round unless one
        is in progress."""
        if self._round is None and eval_due and self.schedule is not None:
            self._round = self.schedule.round_batches()
        if self._round is not None:
            for batch, round_id in self._round:
                return batch, BatchKind.EVAL, round_id
            self._round = None
        if self.schedule is not None:
            self.schedule.note_training()
        return next(self.stream), BatchKind.TRAIN, 0


def _fill_slot(
    slot: WriteSlot, batch: Batch, kind: BatchKind, round_id: int, producer_index: int
) -> BatchMeta:
    """Write the batch's token arrays into `slot`; the descriptor to publish it with."""
    for field in TOKEN_ARRAYS:
        _fill(slot.arrays[field.name], batch.arrays[field.name])
    return BatchMeta(
        batch_id=batch.batch_id,
        epoch=batch.epoch,
        seq=batch.seq,
        producer=producer_index,
        kind=kind,
        round=round_id,
    )


def _lead_decision(
    ring: Ring, producer: Producer | None, order: BatchOrder, stop: StopRequest
) -> tuple[WriteSlot | None, Decision | None]:
    """On the lead: a free slot, or None to stop (stop requested, or the ring closed), and
    the decision to share; (None, None) on the other members of a group."""
    if producer is None:
        return None, None
    slot = None
    if not stop.requested:
        with contextlib.suppress(RingClosed):  # every drafter is done
            slot = producer.acquire()
    return slot, Decision(go=slot is not None, eval_due=order.eval_due(others_published(ring)))


def run_target_loop(
    ring: Ring,
    runner: TargetRunner,
    order: BatchOrder,
    decisions: GroupDecisions,
    bucket: int,
    producer_index: int,
    stop: StopRequest,
    progress: TargetProgress,
) -> int:
    """Produce batches until the ring closes or a stop is requested (the lead decides for
    its group); returns the forward passes run. `progress` counts them, records the run's
    step in the ring and logs a line every few steps."""
    log = get_logger()
    producer = ring.producer() if decisions.is_lead else None
    spec = ring.spec
    done, scratch = "published", None
    if producer is None:  # a group member: identical taps, never published
        done = "run as a target group member"
        hidden = spec.field(HIDDEN)
        scratch = torch.empty(
            spec.max_tokens, hidden.width, dtype=hidden.torch_dtype, device=runner.device
        )
    # Until the first record_progress: compiles, autotunes.
    ring.own_row.set_phase(phases.FIRST_STEP)
    first = decisions.share(
        Decision(True, order.eval_due(others_published(ring))) if producer is not None else None
    )
    batch, kind, round_id = order.next(first.eval_due)
    runner.prefetch(batch.padded(bucket))
    busy = GpuBusySampler(runner.device)
    started = time.perf_counter()
    while True:
        slot, decision = _lead_decision(ring, producer, order, stop)
        decision = decisions.share(decision)
        if not decision.go:
            break
        n, docs = batch.num_tokens, batch.num_docs
        runner.forward_into(slot.arrays[HIDDEN][:n] if slot is not None else scratch[:n])
        meta = _fill_slot(slot, batch, kind, round_id, producer_index) if slot is not None else None
        batch, kind, round_id = order.next(decision.eval_due)
        runner.prefetch(batch.padded(bucket))
        if slot is not None:
            producer.publish(slot, n, docs, meta)
        ring.own_row.record_progress(progress.forward_done(n))
        ring.own_row.report_gpu_busy(busy.sample())
        if progress.produced == 1:
            log.info("first batch %s after %.1f s", done, time.perf_counter() - started)
    if producer is not None:
        producer.finish()
    log.info("target done: %d batches %s", progress.produced, done)
    return progress.produced
