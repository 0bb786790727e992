"""The target rank's loop: batches in, forward passes, tapped hidden states into the ring.

Each iteration takes a free slot of this producer, runs the target forward with the
hooks writing the tapped layers straight into the slot, fills in the token arrays and
publishes the slot. The next batch's host-to-device copy is started while the current
forward runs. The loop ends when the ring closes (the drafters are done) or on SIGTERM.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from ringtrain.data import Batch, BatchStream
from ringtrain.ring import Ring, RingClosed
from ringtrain.target import TargetRunner
from ringtrain.trainer.logs import get_logger
from ringtrain.trainer.signals import StopRequest


def _fill(view: torch.Tensor, values: np.ndarray) -> None:
    view[: len(values)].copy_(torch.from_numpy(values), non_blocking=True)


def run_target_loop(
    ring: Ring,
    runner: TargetRunner,
    stream: BatchStream,
    bucket: int,
    producer_index: int,
    stop: StopRequest,
) -> int:
    """Produce batches until the ring closes or a stop is requested; returns batches produced."""
    log = get_logger()
    producer = ring.producer()
    batch: Batch = next(stream)
    runner.prefetch(batch.padded(bucket))
    produced = 0
    started = time.perf_counter()
    while not stop.requested:
        try:
            slot = producer.acquire()
        except RingClosed:
            break
        n = batch.num_tokens
        runner.forward_into(slot.hidden[:n])
        _fill(slot.input_ids, batch.input_ids)
        _fill(slot.loss_mask, batch.loss_mask)
        _fill(slot.position_ids, batch.position_ids)
        _fill(slot.cu_seqlens, batch.cu_seqlens)
        upcoming = next(stream)
        runner.prefetch(upcoming.padded(bucket))
        producer.publish(
            slot,
            n,
            batch.num_docs,
            {
                "batch_id": batch.batch_id,
                "epoch": batch.epoch,
                "seq": batch.seq,
                "producer": producer_index,
            },
        )
        produced += 1
        ring.beat(produced)
        if produced == 1:
            log.info("first batch published after %.1f s", time.perf_counter() - started)
        batch = upcoming
    producer.finish()
    log.info("target done: %d batches produced", produced)
    return produced
