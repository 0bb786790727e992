"""The drafter rank's loop: take a batch, forward, reduce the sums, backward, step.

One global step = one training batch per drafter rank, in five phases that every rank
runs in the same order: take (evaluating any held-out batches met on the way: see
trainer/heldout.py), forward, reduce (the step's sums: trainer/step_sums.py), backward
with the gradients reduced by DistributedDataParallel while it runs
(trainer/data_parallel.py), apply (clip, optimizer step) and record (ledger, progress in
the ring, report, checkpoint). The sums are reduced before backward, so every rank knows
the global weight sum and scales its loss by ranks / weight sum: the averaged gradient
is exactly the loss normalised by the global count of supervised labels. A step whose
loss (global, so alike on every rank) or reduced gradient norm (alike on every rank, as
the reduced gradients are) is not finite is skipped on every rank: the weights keep
their values, the step counts (its batches are consumed, the schedule advances), its
record says so, and optim.max_nonfinite_steps such steps in a row stop the run. A drafter that
finds no batch (ring closed, SIGTERM) raises the stop flag: then no rank runs backward,
so no rank waits in a gradient reduction, all drafters stop after the same completed
step and no batch is half-trained.

The optimizer step is queued without the host waiting for the GPU (the clip and the skip
happen inside it: drafter/optim.py), so the host takes the next batch and queues its
forward while the GPU still runs the step; the step concludes a step later
(trainer/step_record.py).

The loop reads items through a `take` callable (a ring Consumer's take in a run) and
talks to the ring only through the three calls of RingSide, so it runs as well on an
in-memory stand-in.
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.distributed as dist

from ringtrain.batch import PackedRows
from ringtrain.compile_caches import compiled_graph_count, expected_compile_time
from ringtrain.config import Config
from ringtrain.drafter import (
    FrozenHead,
    ObjectiveSums,
    block_objective,
    evaluate_batch,
    optimizer_step,
)
from ringtrain.drafter.arch import architecture_named, drafter_of
from ringtrain.packed_batch import PackedBatch, random_packed_batch
from ringtrain.ring import ReadItem
from ringtrain.ring.liveness import waiting_on_peers
from ringtrain.trainer.batch_meta import BatchKind, BatchMeta
from ringtrain.trainer.data_parallel import (
    GradSyncProbe,
    data_parallel_ranks,
    scaled_loss,
    wrap_data_parallel,
)
from ringtrain.trainer.gpu_busy import GpuBusySampler
from ringtrain.trainer.heldout import EvalRounds, EvalTally
from ringtrain.trainer.ledger import BatchLedger
from ringtrain.trainer.logs import get_logger
from ringtrain.trainer.signals import StopRequest
from ringtrain.trainer.step_record import Reporter, StepConclusions, StepRecord, UnreadStep
from ringtrain.trainer.step_sums import ReducedSums, StepSums


def anchor_seed(run_seed: int, meta: BatchMeta) -> int:
    """The seed of a training batch's anchors: the run seed and the batch's place in its
    target's stream, not the drafter that takes it (which follows timing), so a batch
    gives the same gradient on any drafter rank, in a resumed run as in an unbroken one."""
    return ((run_seed * 1_000_003 + meta.producer) * 1_000_000_007 + meta.seq) % (1 << 63)


@dataclass
class DrafterState:
    """Everything the loop advances and a checkpoint saves."""

    step: int
    ledger: BatchLedger
    evaluated_step: int = 0  # the step the last completed held-out round was due after


class RowSide(Protocol):
    """What the loop publishes in its rank's row of the ring (a ring's OwnRow is one)."""

    def record_progress(self, count: int) -> None: ...

    def report_gpu_busy(self, fraction: float | None) -> None: ...


class RingSide(Protocol):
    """What the loop tells the ring and asks of it, besides items (a Ring is one)."""

    own_row: RowSide

    def gpu_busy_by_rank(self) -> dict[int, float]: ...


@dataclass
class Trainee:
    """The drafter being trained: its model, the frozen head, optimizer and schedule.

    `model` is the plain module (checkpoints save it); the loop trains it through DDP
    when other drafters share the gradients."""

    model: torch.nn.Module  # one of drafter/arch/__init__.py's ARCHITECTURES
    head: FrozenHead
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler


class DrafterLoop:
    """One drafter rank's training loop (see the module docstring)."""

    def __init__(
        self,
        config: Config,
        take: Callable[[], ReadItem | None],
        ring: RingSide,
        trainee: Trainee,
        drafter_index: int,
        drafter_count: int,
        group: dist.ProcessGroup | None,
        eval_batches_per_round: int,
    ) -> None:
        self.config = config
        self.take = take
        self.ring = ring
        self.trainee = trainee
        self.drafter_index = drafter_index
        self.group = group
        # Spans in which this rank waits on the other drafters (the step's reduction, and
        # backward, which waits for DDP's): working, for the ring's liveness sampler.
        self.with_peers = (
            functools.partial(waiting_on_peers, dist.get_world_size(group))
            if group is not None
            else contextlib.nullcontext
        )
        self.device = next(trainee.model.parameters()).device
        self.block_size = config.drafter.block_size
        self.network = wrap_data_parallel(trainee.model, group, config.optim.grad_reduce_dtype)
        self.ranks = data_parallel_ranks(group)
        self.grad_sync = GradSyncProbe(self.network)
        self.sums = StepSums(
            self.block_size,
            drafter_count,
            self.device,
            architecture_named(config.drafter.architecture).sums_type,
        )
        self.busy = GpuBusySampler(self.device)
        self.generator = torch.Generator(device=self.device)
        self.eval_batches_per_round = eval_batches_per_round
        self.rounds = EvalRounds(config.run.eval_every, config.run.max_steps)
        # The held-out rounds' sums; train() starts it at the round its state owes next.
        self._tally = EvalTally(eval_batches_per_round, self.block_size, self.sums.sums_type)
        self._waiting_since: float | None = None  # set while the session's first item is due
        self.autocast = torch.autocast(
            self.device.type, dtype=torch.bfloat16, enabled=self.device.type == "cuda"
        )

    def train(
        self,
        state: DrafterState,
        stop: StopRequest,
        reporter: Reporter | None = None,
        save: Callable[[DrafterState], None] | None = None,
    ) -> DrafterState:
        """Train until max_steps, a stop request, or a closed ring; returns the final state.

        `reporter` gets every step and evaluation round, `save` is called at every
        checkpoint step and at the end (both only on the lead drafter)."""
        run = self.config.run
        tally = self._start_session(state)
        last_saved, first_step = state.step, state.step + 1
        conclusions = StepConclusions(
            reporter, first_step, run.log_every, self.config.optim.max_nonfinite_steps
        )
        unread: UnreadStep | None = None  # the last step, its gradient norm not yet read
        while state.step < run.max_steps:
            step, started = state.step + 1, time.perf_counter()
            item = self._take_training_item(stop)
            self._announce_first_item(item)
            loss_sum = None if item is None else self._forward(item)
            if loss_sum is None:
                self.sums.request_stop()
            with self.with_peers():
                reduced = self.sums.reduce(self.group)
            concluded = conclusions.conclude(unread)
            unread = None
            if reduced.stopped:
                conclusions.report(concluded)
                self._report_evaluation(tally, reduced, state, reporter)
                self._discard(step, stop)
                break
            summary, grad_norm = self._apply(reduced, loss_sum, step)
            # The last step is reported once this one's backward is queued: the lead
            # drafter's writing neither holds back the backward nor makes the lead enter
            # it after the other drafters at every step.
            conclusions.report(concluded)
            self._report_evaluation(tally, reduced, state, reporter)
            unread = UnreadStep(self._record(state, step, reduced, summary, started), grad_norm)
            if save is not None and run.checkpoint_every and step % run.checkpoint_every == 0:
                conclusions.report(conclusions.conclude(unread))
                unread = None
                save(state)
                last_saved = step
        conclusions.report(conclusions.conclude(unread))
        conclusions.fail_if_nothing_trained(state.step - first_step + 1)
        if save is not None and state.step != last_saved:
            save(state)
        if state.step == run.max_steps:
            self._finish_rounds(tally, stop, reporter, state)
        return state

    def _start_session(self, state: DrafterState) -> EvalTally:
        """The held-out rounds' tally from the round `state` owes next; the drafter compiled
        ahead where it does; then the wait for the first batch begins."""
        self._tally = EvalTally(
            self.eval_batches_per_round,
            self.block_size,
            self.sums.sums_type,
            self.rounds.done_by(state.evaluated_step) + 1,
        )
        if self.compiles_ahead:
            self.compile_ahead()
        self._waiting_since = time.perf_counter()
        get_logger().info(
            "waiting for the first batch: the target ranks load the target and run its first "
            "forward (their logs say how far they are)"
        )
        return self._tally

    @property
    def compiles_ahead(self) -> bool:
        """Whether the drafter compiles before its first batch (CUDA, drafter.compile)."""
        return self.config.drafter.compile and self.device.type == "cuda"

    def compile_ahead(self) -> None:
        """Compile the drafter while the target ranks still load the target and run its
        first forward, instead of after it: one forward and backward of a random batch in
        the run's static layout (every batch has its shapes), every drafter rank alike
        (DDP reduces the gradients as in a step). The gradients are then dropped and no
        optimizer step runs, so the weights, the optimizer state and the schedule are
        untouched; the anchor generator is seeded anew from every batch, so the run's
        trajectory is the same as without this."""
        started = time.perf_counter()
        get_logger().info(
            "compiling the drafter while the target starts (Inductor, flex_attention): %s",
            expected_compile_time(),
        )
        objective = self._objective(self._layout_batch(), seed=0)
        with self.with_peers():
            objective.loss_sum.backward()
        self.trainee.model.zero_grad(set_to_none=self.network is self.trainee.model)
        get_logger().info("drafter compiled in %.1f s", time.perf_counter() - started)

    def _layout_batch(self) -> PackedBatch:
        """Random documents of data.max_len tokens filling data.token_budget."""
        spec = drafter_of(self.trainee.model).spec
        budget, max_len = self.config.data.token_budget, self.config.data.max_len
        length = min(max_len, budget)
        return random_packed_batch(
            [length] * (budget // length),
            spec.num_taps * spec.hidden_size,
            self.trainee.head.lm_head.shape[0],
            self.device,
            self.trainee.head.lm_head.dtype,
            seed=0,
        )

    def _announce_first_item(self, item: ReadItem | None) -> None:
        """Once, when the session's first item arrives: how long it took."""
        if item is None or self._waiting_since is None:
            return
        waited = time.perf_counter() - self._waiting_since
        self._waiting_since = None
        get_logger().info("first batch after %.1f s; the first step runs", waited)

    # ---- take ------------------------------------------------------------------------

    def _take_training_item(self, stop: StopRequest) -> ReadItem | None:
        """The next training item, evaluating any evaluation items on the way."""
        while not stop.requested:
            item = self.take()
            if item is None or item.meta.kind != BatchKind.EVAL:
                return item
            self._evaluate(item)
        return None

    def _evaluate(self, item: ReadItem) -> None:
        trainee = self.trainee
        with torch.no_grad(), self.autocast:
            sums = evaluate_batch(
                self.network,
                trainee.head,
                item,
                self.config.drafter,
                max_tokens=self.config.data.token_budget,
            )
        self.sums.add_evaluation(sums, self._tally.ahead(item.meta.round))

    # ---- forward ---------------------------------------------------------------------

    def _forward(self, item: ReadItem) -> torch.Tensor:
        """The objective on this drafter's batch (anchors seeded by the run seed and the
        batch: see anchor_seed): its sums are added to the step's, its loss sum is returned."""
        objective = self._objective(item, anchor_seed(self.config.run.seed, item.meta))
        self.sums.add_training(self.drafter_index, objective, item.num_tokens, item.meta)
        return objective.loss_sum

    def _objective(self, rows: PackedRows, seed: int) -> ObjectiveSums:
        """The block objective on one batch, its anchors drawn from ``seed``."""
        self.generator.manual_seed(seed)
        with self.autocast:
            return block_objective(
                self.network,
                self.trainee.head,
                rows,
                self.generator,
                self.config.drafter,
                max_tokens=self.config.data.token_budget,
            )

    def _discard(self, step: int, stop: StopRequest) -> None:
        get_logger().info(
            "stopping before step %d (%s)", step, stop.signal_name or "no more batches"
        )

    # ---- apply -----------------------------------------------------------------------

    def _apply(
        self, reduced: ReducedSums, loss_sum: torch.Tensor, step: int
    ) -> tuple[dict, torch.Tensor | None]:
        """Backward of the normalised loss (the gradients reduced meanwhile) and the
        optimizer step, queued; returns the summary and the gradient norm, on the device
        (None: the loss was not finite, so no rank ran backward). The schedule advances
        either way."""
        summary = reduced.summary()
        trainee = self.trainee
        if not math.isfinite(summary["loss"]):
            trainee.scheduler.step()
            return summary, None
        with self.with_peers():
            scaled_loss(loss_sum, self.ranks, summary["weight_sum"]).backward()
        norm = optimizer_step(
            trainee.model,
            trainee.optimizer,
            trainee.scheduler,
            self.config.optim,
            grads_to_none=self.network is trainee.model,
            clip_in_step=True,
        )
        return summary, norm

    # ---- record ----------------------------------------------------------------------

    def _record(
        self, state: DrafterState, step: int, reduced: ReducedSums, summary: dict, started: float
    ) -> StepRecord:
        """Advance the state (ledger, step), publish progress and GPU busy to the ring."""
        for producer, seq, _batch_id in reduced.batches:
            state.ledger.record(producer, seq)
        state.step = step
        self.ring.own_row.record_progress(step)
        record = StepRecord(
            step=step,
            **reduced.step_metrics(summary),
            tokens=reduced.tokens,
            seconds=time.perf_counter() - started,
            lr=self.trainee.scheduler.get_last_lr()[0],
            batches=reduced.batches,
            wall=time.time(),
            compiles=compiled_graph_count(),
            gpu_busy=self.busy.sample(),
            gpu_busy_by_rank=self.ring.gpu_busy_by_rank(),
        )
        sync = self.grad_sync.sample()
        if sync is not None:
            record.grad_sync_ms, record.grad_sync_exposed_ms = sync
        self.ring.own_row.report_gpu_busy(record.gpu_busy)
        return record

    # ---- evaluation rounds -----------------------------------------------------------

    def _report_evaluation(
        self, tally: EvalTally, reduced: ReducedSums, state: DrafterState, reporter: Reporter | None
    ) -> None:
        """Absorb the step's evaluation sums; a completed round is the one after the last
        completed, reported as after the step it was due after (also kept in `state`)."""
        for evaluated in tally.absorb(reduced.eval_batches, reduced.eval):
            round_id = self.rounds.done_by(state.evaluated_step) + 1
            state.evaluated_step = self.rounds.step_of(round_id)
            if reporter is not None:
                reporter.evaluation(state.evaluated_step, {**evaluated, "round": round_id})

    def _finish_rounds(
        self, tally: EvalTally, stop: StopRequest, reporter: Reporter | None, state: DrafterState
    ) -> None:
        """Complete the evaluation rounds up to the one due after the last step; training
        items taken meanwhile are dropped (not recorded, so a resumed run still trains them)."""
        while self.rounds.done_by(state.evaluated_step) < self.rounds.count:
            item = None if stop.requested else self.take()
            if item is None:
                self.sums.request_stop()
            elif item.meta.kind == BatchKind.EVAL:
                self._evaluate(item)
            with self.with_peers():
                reduced = self.sums.reduce(self.group)
            self._report_evaluation(tally, reduced, state, reporter)
            if reduced.stopped:
                return
