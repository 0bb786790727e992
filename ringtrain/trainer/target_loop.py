"""The target rank's loop: batches in, forward passes, tapped hidden states into the ring.

Each iteration takes a free slot of this producer, runs the target forward with the
hooks writing the tapped layers straight into the slot, fills in the token arrays and
publishes the slot. The next batch's host-to-device copy is started while the current
forward runs. Held-out batches are inserted when evaluation is due (trainer/evaluation.py).
The loop ends when the ring closes (the drafters are done) or on SIGTERM.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import torch

from ringtrain.data import Batch, BatchStream
from ringtrain.ring import Phase, Ring, RingClosed
from ringtrain.target import TargetRunner
from ringtrain.target.loader import is_hybrid
from ringtrain.trainer.batch_meta import BatchKind, BatchMeta
from ringtrain.trainer.evaluation import EvalSchedule
from ringtrain.trainer.gpu_busy import GpuBusySampler
from ringtrain.trainer.logs import get_logger
from ringtrain.trainer.signals import StopRequest


def _fill(view: torch.Tensor, values: np.ndarray) -> None:
    view[: len(values)].copy_(torch.from_numpy(values), non_blocking=True)


def _batches(
    ring: Ring, stream: BatchStream, schedule: EvalSchedule | None
) -> Iterator[tuple[Batch, BatchKind, int]]:
    """(batch, kind, eval round) in production order: training batches, with this target's
    held-out shard inserted whenever the drafters reach the next evaluation step."""
    while True:
        if schedule is not None and schedule.due(ring.drafter_step()):
            for batch, round_id in schedule.round_batches():
                yield batch, BatchKind.EVAL, round_id
        yield next(stream), BatchKind.TRAIN, 0


def run_target_loop(
    ring: Ring,
    runner: TargetRunner,
    stream: BatchStream,
    schedule: EvalSchedule | None,
    bucket: int,
    producer_index: int,
    stop: StopRequest,
) -> int:
    """Produce batches until the ring closes or a stop is requested; returns batches produced."""
    log = get_logger()
    producer = ring.producer()
    source = _batches(ring, stream, schedule)
    batch, kind, round_id = next(source)
    runner.prefetch(batch.padded(bucket))
    produced = 0
    busy = GpuBusySampler(runner.device)
    started = time.perf_counter()
    if runner.device.type == "cuda" and is_hybrid(runner.config):
        log.info(
            "the first forward autotunes the Gated DeltaNet Triton kernels; this takes "
            "about a minute with empty caches"
        )
    ring.set_phase(Phase.FIRST_STEP)  # until the first record_progress: compiles, autotunes
    while not stop.requested:
        try:
            slot = producer.acquire()
        except RingClosed:
            break
        n, docs = batch.num_tokens, batch.num_docs
        runner.forward_into(slot.hidden[:n])
        _fill(slot.input_ids, batch.input_ids)
        _fill(slot.loss_mask, batch.loss_mask)
        _fill(slot.position_ids, batch.position_ids)
        _fill(slot.cu_seqlens, batch.cu_seqlens)
        meta = BatchMeta(
            batch_id=batch.batch_id,
            epoch=batch.epoch,
            seq=batch.seq,
            producer=producer_index,
            kind=kind,
            round=round_id,
        )
        batch, kind, round_id = next(source)
        runner.prefetch(batch.padded(bucket))
        producer.publish(slot, n, docs, meta)
        produced += 1
        ring.record_progress(produced)
        ring.report_gpu_busy(busy.sample())
        if produced == 1:
            log.info("first batch published after %.1f s", time.perf_counter() - started)
    producer.finish()
    log.info("target done: %d batches produced", produced)
    return produced
