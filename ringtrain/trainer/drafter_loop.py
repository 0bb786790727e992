"""The drafter rank's loop: take a slot, run the DFlash objective, all-reduce, step.

One global step = one batch per drafter rank. Gradients live in one flat buffer that is
all-reduced once per step together with the step statistics; the summed gradients are
then divided by the global weight sum, which gives exactly the loss normalised by the
global count of supervised labels. A drafter that finds no batch (ring closed, SIGTERM)
raises a stop flag in the same all-reduce: the step is then discarded on every rank, so
all drafters stop after the same completed step and no batch is half-trained.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ringtrain.config import Config
from ringtrain.drafter import (
    DFlashDrafter,
    FrozenHead,
    ObjectiveSums,
    block_objective,
    compiled_graph_count,
    optimizer_step,
)
from ringtrain.ring import Ring
from ringtrain.trainer.gpu_busy import GpuBusySampler
from ringtrain.trainer.ledger import BatchLedger
from ringtrain.trainer.logs import MetricsWriter, get_logger
from ringtrain.trainer.signals import StopRequest

# Layout of the statistics tail of the all-reduced buffer (then correct[k], counted[k]).
LOSS, WEIGHT, PREFIX, BLOCKS, TOKENS, STOP = range(6)
FIXED_STATS = 6


class GradientBucket:
    """Every parameter's .grad as a view into one flat fp32 buffer, plus a stats tail."""

    def __init__(self, params: list[torch.nn.Parameter], stats_len: int) -> None:
        total = sum(p.numel() for p in params)
        self.flat = torch.zeros(total + stats_len, dtype=torch.float32, device=params[0].device)
        offset = 0
        for p in params:
            p.grad = self.flat[offset : offset + p.numel()].view_as(p)
            offset += p.numel()
        self.grads = self.flat[:total]
        self.stats = self.flat[total:]

    def zero(self) -> None:
        self.flat.zero_()


@dataclass
class StepRecord:
    """What one completed global step did, as the lead drafter reports it."""

    step: int
    loss: float
    accuracy: list[float]
    tau: float
    tokens: int
    seconds: float
    lr: float
    batches: list[list[int]]
    wall: float  # time.time() at the end of the step
    compiles: int  # frames compiled so far in this process (flat in steady state)
    gpu_busy: float | None  # this rank's GPU busy fraction since the last step (NVML)


@dataclass
class DrafterState:
    """Everything the loop advances and a checkpoint saves."""

    step: int
    ledger: BatchLedger


def _record_from(
    stats: torch.Tensor,
    step: int,
    seconds: float,
    lr: float,
    ids: list[list[int]],
    gpu_busy: float | None,
) -> StepRecord:
    block = (len(stats) - FIXED_STATS) // 2
    correct = stats[FIXED_STATS : FIXED_STATS + block]
    counted = stats[FIXED_STATS + block :]
    weight = max(float(stats[WEIGHT]), 1e-12)
    blocks = max(float(stats[BLOCKS]), 1.0)
    return StepRecord(
        step=step,
        loss=float(stats[LOSS]) / weight,
        accuracy=[float(c) / max(float(n), 1.0) for c, n in zip(correct, counted, strict=True)],
        tau=1.0 + float(stats[PREFIX]) / blocks,
        tokens=int(stats[TOKENS]),
        seconds=seconds,
        lr=lr,
        batches=ids,
        wall=time.time(),
        compiles=compiled_graph_count(),
        gpu_busy=gpu_busy,
    )


def run_drafter_loop(
    config: Config,
    ring: Ring,
    model: DFlashDrafter,
    head: FrozenHead,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    state: DrafterState,
    drafter_index: int,
    drafter_count: int,
    group: dist.ProcessGroup | None,
    stop: StopRequest,
    on_step: Callable[[StepRecord], None],
    save: Callable[[DrafterState], None],
    metrics: MetricsWriter | None,
) -> DrafterState:
    """Train until max_steps, a stop request, or a closed ring; returns the final state."""
    log = get_logger()
    device = next(model.parameters()).device
    block_size = config.drafter.block_size
    params = [p for p in model.parameters() if p.requires_grad]
    bucket = GradientBucket(params, FIXED_STATS + 2 * (block_size - 1))
    ids = torch.zeros(drafter_count, 3, dtype=torch.int64, device=device)
    consumer = ring.consumer(device)
    busy = GpuBusySampler(device)
    generator = torch.Generator(device=device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    max_steps = config.run.max_steps
    checkpoint_every = config.run.checkpoint_every
    last_saved = state.step
    while state.step < max_steps:
        step = state.step + 1
        started = time.perf_counter()
        item = None if stop.requested else consumer.take()
        ids.zero_()
        if item is None:
            bucket.stats[STOP] = 1.0
        else:
            generator.manual_seed(config.run.seed * 1_000_003 + step * 1009 + drafter_index)
            with autocast:
                sums: ObjectiveSums = block_objective(
                    model,
                    head,
                    item.hidden,
                    item.input_ids,
                    item.loss_mask,
                    item.position_ids,
                    item.cu_seqlens,
                    item.num_tokens,
                    item.num_docs,
                    generator,
                    config.drafter,
                    max_tokens=config.data.token_budget,
                )
            sums.loss_sum.backward()
            stats = bucket.stats
            stats[LOSS] = sums.loss_sum.detach()
            stats[WEIGHT] = sums.weight_sum
            stats[PREFIX] = sums.accepted_sum
            stats[BLOCKS] = sums.block_count
            stats[TOKENS] = float(item.num_tokens)
            stats[FIXED_STATS : FIXED_STATS + block_size - 1] = sums.correct
            stats[FIXED_STATS + block_size - 1 :] = sums.counted
            meta = item.meta
            ids[drafter_index, 0] = meta["producer"]
            ids[drafter_index, 1] = meta["seq"]
            ids[drafter_index, 2] = meta["batch_id"]
        if group is not None:
            dist.all_reduce(bucket.flat, group=group)
            dist.all_reduce(ids, group=group)
        host_stats = bucket.stats.to("cpu", copy=True)
        if host_stats[STOP] > 0:
            bucket.zero()
            log.info("stopping before step %d (%s)", step, stop.signal_name or "no more batches")
            break
        bucket.grads.div_(max(float(host_stats[WEIGHT]), 1.0))
        optimizer_step(model, optimizer, scheduler, config.optim)
        bucket.stats.zero_()
        batch_ids = ids.cpu().tolist()
        for producer, seq, _batch_id in batch_ids:
            state.ledger.record(int(producer), int(seq))
        state.step = step
        ring.beat(step)
        record = _record_from(
            host_stats,
            step,
            time.perf_counter() - started,
            scheduler.get_last_lr()[0],
            batch_ids,
            busy.sample(),
        )
        if not math.isfinite(record.loss):
            raise FloatingPointError(f"loss is {record.loss} at step {step}: lower optim.lr")
        if metrics is not None:
            metrics.write({"event": "step", **record.__dict__})
        on_step(record)
        if checkpoint_every and step % checkpoint_every == 0:
            save(state)
            last_saved = step
    if state.step != last_saved:
        save(state)
    return state
