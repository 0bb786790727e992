"""The drafter rank's loop: take a slot, run the DFlash objective, all-reduce, step.

One global step = one training batch per drafter rank. Gradients live in one flat
buffer, all-reduced once per step; a second small fp64 vector carries the step's sums
(objective metrics, tokens, stop flag, batch ids, evaluation sums) in the same way. The
summed gradients are divided by the global weight sum, which is exactly the loss
normalised by the global count of supervised labels. A drafter that finds no batch
(ring closed, SIGTERM) raises the stop flag: the step is then discarded on every rank,
so all drafters stop after the same completed step and no batch is half-trained.
Evaluation batches (see trainer/evaluation.py) are evaluated as they arrive.
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
    EvalSums,
    FrozenHead,
    ObjectiveSums,
    block_objective,
    compiled_graph_count,
    evaluate_batch,
    optimizer_step,
)
from ringtrain.ring import ReadItem, Ring
from ringtrain.trainer.batch_meta import BatchKind, BatchMeta
from ringtrain.trainer.evaluation import EvalTally, final_round
from ringtrain.trainer.gpu_busy import GpuBusySampler
from ringtrain.trainer.ledger import BatchLedger
from ringtrain.trainer.logs import MetricsWriter, get_logger
from ringtrain.trainer.signals import StopRequest


class GradientBucket:
    """Every parameter's .grad as a view into one flat fp32 buffer."""

    def __init__(self, params: list[torch.nn.Parameter]) -> None:
        total = sum(p.numel() for p in params)
        self.flat = torch.zeros(total, dtype=torch.float32, device=params[0].device)
        offset = 0
        for p in params:
            p.grad = self.flat[offset : offset + p.numel()].view_as(p)
            offset += p.numel()


class StepSums:
    """The fp64 vector all-reduced each step, with named sections.

    [objective sums | tokens, stop | (producer, seq, batch_id) per drafter | eval batches,
    eval sums]"""

    def __init__(self, objective_len: int, eval_len: int, drafters: int, device) -> None:
        self.objective = slice(0, objective_len)
        self.tokens = objective_len
        self.stop = objective_len + 1
        ids_start = objective_len + 2
        self.ids = slice(ids_start, ids_start + 3 * drafters)
        self.eval_batches = self.ids.stop
        self.eval = slice(self.eval_batches + 1, self.eval_batches + 1 + eval_len)
        self.vector = torch.zeros(self.eval.stop, dtype=torch.float64, device=device)

    def set_ids(self, drafter_index: int, meta: BatchMeta) -> None:
        start = self.ids.start + 3 * drafter_index
        self.vector[start : start + 3] = torch.tensor(
            [meta.producer, meta.seq, meta.batch_id], dtype=torch.float64
        )


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
    compiles: int  # graphs compiled so far in this process (flat in steady state)
    gpu_busy: float | None  # this rank's GPU busy fraction since the last step (NVML)
    gpu_busy_by_rank: dict[int, float]  # last fraction published by each rank of the node


@dataclass
class DrafterState:
    """Everything the loop advances and a checkpoint saves."""

    step: int
    ledger: BatchLedger


class DrafterLoop:
    """One drafter rank's training loop (see the module docstring)."""

    def __init__(
        self,
        config: Config,
        ring: Ring,
        model: DFlashDrafter,
        head: FrozenHead,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler,
        drafter_index: int,
        drafter_count: int,
        group: dist.ProcessGroup | None,
        eval_batches_per_round: int,
    ) -> None:
        self.config = config
        self.ring = ring
        self.model = model
        self.head = head
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.drafter_index = drafter_index
        self.group = group
        self.device = next(model.parameters()).device
        self.block_size = config.drafter.block_size
        self.bucket = GradientBucket([p for p in model.parameters() if p.requires_grad])
        vector_len = 4 + 2 * (self.block_size - 1)
        self.sums = StepSums(vector_len, vector_len + 2, drafter_count, self.device)
        self.consumer = ring.consumer(self.device, BatchMeta)
        self.busy = GpuBusySampler(self.device)
        self.generator = torch.Generator(device=self.device)
        self.eval_batches_per_round = eval_batches_per_round
        self.autocast = torch.autocast(
            self.device.type, dtype=torch.bfloat16, enabled=self.device.type == "cuda"
        )

    def _evaluate(self, item: ReadItem) -> None:
        with torch.no_grad(), self.autocast:
            sums: EvalSums = evaluate_batch(
                self.model,
                self.head,
                item,
                self.config.drafter,
                max_tokens=self.config.data.token_budget,
            )
        vector = self.sums.vector
        vector[self.sums.eval_batches] += 1
        vector[self.sums.eval] += sums.as_vector()

    def _take_training_item(self, stop: StopRequest) -> ReadItem | None:
        """The next training item, evaluating any evaluation items on the way."""
        while not stop.requested:
            item = self.consumer.take()
            if item is None or item.meta.kind != BatchKind.EVAL:
                return item
            self._evaluate(item)
        return None

    def _reduce(self) -> torch.Tensor:
        if self.group is not None:
            dist.all_reduce(self.bucket.flat, group=self.group)
            dist.all_reduce(self.sums.vector, group=self.group)
        return self.sums.vector.to("cpu", copy=True)

    def _eval_metrics(self, tally: EvalTally, host: torch.Tensor) -> dict | None:
        return tally.absorb(int(host[self.sums.eval_batches]), host[self.sums.eval])

    def train(
        self,
        state: DrafterState,
        stop: StopRequest,
        on_step: Callable[[StepRecord], None],
        on_eval: Callable[[int, dict], None],
        save: Callable[[DrafterState], None],
        metrics: MetricsWriter | None,
    ) -> DrafterState:
        """Train until max_steps, a stop request, or a closed ring; returns the final state."""
        log = get_logger()
        config = self.config
        max_steps, eval_every = config.run.max_steps, config.run.eval_every
        rounds_done = state.step // eval_every if eval_every else 0
        tally = EvalTally(
            self.sums.eval.stop - self.sums.eval.start,
            self.eval_batches_per_round,
            self.block_size,
            rounds_done,
        )
        checkpoint_every = config.run.checkpoint_every
        last_saved = state.step
        sums = self.sums
        if config.drafter.compile and self.device.type == "cuda":
            log.info(
                "the first step compiles the drafter (Inductor, flex_attention); this takes "
                "a minute or so with empty caches and seconds with warm ones"
            )
        while state.step < max_steps:
            step = state.step + 1
            started = time.perf_counter()
            item = self._take_training_item(stop)
            if item is None:
                sums.vector[sums.stop] = 1.0
            else:
                seed = config.run.seed * 1_000_003 + step * 1009 + self.drafter_index
                self.generator.manual_seed(seed)
                with self.autocast:
                    objective: ObjectiveSums = block_objective(
                        self.model,
                        self.head,
                        item,
                        self.generator,
                        config.drafter,
                        max_tokens=config.data.token_budget,
                    )
                objective.loss_sum.backward()
                sums.vector[sums.objective] = objective.as_vector()
                sums.vector[sums.tokens] = float(item.num_tokens)
                sums.set_ids(self.drafter_index, item.meta)
            host = self._reduce()
            sums.vector.zero_()
            evaluated = self._eval_metrics(tally, host)
            if evaluated is not None:
                on_eval(state.step, evaluated)
            if host[sums.stop] > 0:
                self.bucket.flat.zero_()
                log.info(
                    "stopping before step %d (%s)", step, stop.signal_name or "no more batches"
                )
                break
            summary = ObjectiveSums.summarise(host[sums.objective], self.block_size)
            self.bucket.flat.div_(max(summary["weight_sum"], 1e-12))
            optimizer_step(self.model, self.optimizer, self.scheduler, config.optim)
            ids = host[sums.ids].view(-1, 3).long().tolist()
            for producer, seq, _batch_id in ids:
                state.ledger.record(producer, seq)
            state.step = step
            self.ring.record_progress(step)
            if not math.isfinite(summary["loss"]):
                raise FloatingPointError(
                    f"loss is {summary['loss']} at step {step}: lower optim.lr"
                )
            record = StepRecord(
                step=step,
                loss=summary["loss"],
                accuracy=summary["accuracy_per_slot"],
                tau=summary["tau"],
                tokens=int(host[sums.tokens]),
                seconds=time.perf_counter() - started,
                lr=self.scheduler.get_last_lr()[0],
                batches=ids,
                wall=time.time(),
                compiles=compiled_graph_count(),
                gpu_busy=self.busy.sample(),
                gpu_busy_by_rank=self.ring.gpu_busy_by_rank(),
            )
            self.ring.report_gpu_busy(record.gpu_busy)
            if metrics is not None:
                metrics.write({"event": "step", **record.__dict__})
            on_step(record)
            if checkpoint_every and step % checkpoint_every == 0:
                save(state)
                last_saved = step
        if state.step != last_saved:
            save(state)
        last_round = final_round(max_steps, eval_every)
        if state.step == max_steps and tally.completed_rounds < last_round:
            self._finish_rounds(tally, last_round, stop, on_eval, state.step)
        return state

    def _finish_rounds(
        self,
        tally: EvalTally,
        last_round: int,
        stop: StopRequest,
        on_eval: Callable[[int, dict], None],
        step: int,
    ) -> None:
        """Complete the evaluation rounds up to the one due at the last step; training items
        taken meanwhile are dropped (not recorded, so a resumed run still trains them)."""
        sums = self.sums
        while tally.completed_rounds < last_round:
            item = None if stop.requested else self.consumer.take()
            if item is None:
                sums.vector[sums.stop] = 1.0
            elif item.meta.kind == BatchKind.EVAL:
                self._evaluate(item)
            if self.group is not None:
                dist.all_reduce(sums.vector, group=self.group)
            host = sums.vector.to("cpu", copy=True)
            sums.vector.zero_()
            evaluated = self._eval_metrics(tally, host)
            if evaluated is not None:
                on_eval(step, evaluated)
            if host[sums.stop] > 0:
                return
