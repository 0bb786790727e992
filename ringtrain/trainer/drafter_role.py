"""A drafter rank's session: its trainee built (and resumed from the plan's checkpoint),
the lead drafter's reports and checkpoints wired in, and the training loop run."""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import msgspec
import torch

from ringtrain.checkpoint import ResumeRecord
from ringtrain.checkpoint.resume import resume_training, save_training
from ringtrain.drafter import FrozenHead, build_optimizer, load_frozen_head, seeded_drafter
from ringtrain.monitor.sinks import open_sinks
from ringtrain.ring import Ring
from ringtrain.trainer import phases
from ringtrain.trainer.batch_meta import BatchMeta
from ringtrain.trainer.context import SessionContext
from ringtrain.trainer.drafter_loop import DrafterLoop, DrafterState, Trainee
from ringtrain.trainer.ledger import BatchLedger
from ringtrain.trainer.logs import MetricsWriter, get_logger, last_evaluation
from ringtrain.trainer.plan import eval_batches_per_round
from ringtrain.trainer.progress import LeadReporter, Progress
from ringtrain.trainer.run_dir import read_run_id


def run_drafter(ctx: SessionContext, ring: Ring) -> int:
    """Train as one of the drafters (the lead one also reports and checkpoints); returns
    the run's step reached."""
    info = ctx.info
    ring.own_row.set_phase(phases.BUILDING_DRAFTER)
    trainee = build_trainee(ctx)
    state = resumed_state(ctx, trainee)
    ring.own_row.start_at(state.step)
    # The other drafters wait in the next step's reduction while the lead saves.
    reporter, save = None, ring.own_row.phase_marker(phases.CHECKPOINT)
    if info.is_lead_drafter:
        reporter = _lead_reporter(ctx, ring, state)
        save = ring.own_row.announcing(phases.CHECKPOINT, _saver(ctx, trainee))
    loop = DrafterLoop(
        ctx.config,
        ring.consumer(info.device, BatchMeta).take,
        ring,
        trainee,
        info.role_index,
        info.role_count,
        ctx.groups.drafters,
        eval_batches_per_round(ctx.config, ctx.plan, info),
    )
    ring.own_row.set_phase(phases.FIRST_STEP)
    loop.train(state, ctx.stop, reporter, save)
    get_logger().info("drafter weights digest: %s", _weights_digest(trainee.model))
    if reporter is not None:
        reporter.close()
    return state.step


def build_trainee(ctx: SessionContext) -> Trainee:
    """A fresh drafter on the rank's device (initialised from run.seed: alike on every
    drafter rank), the target's frozen head, the optimizer and schedule."""
    config, plan, device = ctx.config, ctx.plan, ctx.info.device
    if config.target.random_weights:
        head = FrozenHead.random(
            plan.spec.vocab_size,
            plan.spec.hidden_size,
            device,
            plan.hidden_dtype,
            seed=config.run.seed,
        )
    else:
        get_logger().info("loading frozen embedding and LM head from %s", plan.target_path)
        head = load_frozen_head(plan.target_path, device, plan.hidden_dtype)
    model = seeded_drafter(plan.spec, device, config.run.seed)
    count = sum(parameter.numel() for parameter in model.parameters() if parameter.requires_grad)
    get_logger().info("drafter built on %s: %s trainable parameters", device, f"{count:,}")
    scale = model.fit_output_scale(head)
    get_logger().info("a fresh drafter's output norm: %.4g (fitted to the LM head)", scale)
    optimizer, scheduler = build_optimizer(model, config.optim, config.run.max_steps)
    return Trainee(model, head, optimizer, scheduler)


def resumed_state(ctx: SessionContext, trainee: Trainee) -> DrafterState:
    """Step 0 with an empty ledger, or the plan's checkpoint loaded into `trainee` (its
    schedule replaced by the resumed one: checkpoint/resume.py)."""
    if ctx.plan.resume_from is None:
        return DrafterState(step=0, ledger=BatchLedger())
    point, trainee.scheduler = resume_training(
        ctx.plan.resume_from,
        trainee.model,
        trainee.optimizer,
        ctx.config.optim,
        ctx.config.run.max_steps,
        ctx.info.device,
    )
    return DrafterState(point.step, BatchLedger(point.cursors), point.evaluated_step)


def _lead_reporter(ctx: SessionContext, ring: Ring, state: DrafterState) -> LeadReporter:
    """The lead drafter's reporter: metrics.jsonl (and run.report_to) and progress lines."""
    metrics_path = ctx.run_dir / "metrics.jsonl"
    metrics = MetricsWriter(
        metrics_path,
        open_sinks(ctx.config, ctx.run_dir),
        resumed_step=state.step,
        evaluated_step=state.evaluated_step,
    )
    for note in metrics.notes:
        get_logger().info("%s", note)
    progress = Progress(ctx.config, ring, state.step, last_evaluation(metrics_path))
    return LeadReporter(metrics, progress)


def _saver(ctx: SessionContext, trainee: Trainee) -> Callable[[DrafterState], None]:
    """The lead drafter's save: a checkpoint of a state, whose resume record is the run's
    (its id, its batch sequence) with the state's step, data cursors and last completed
    held-out round."""
    identity = ResumeRecord(step=0, run_id=read_run_id(ctx.run_dir), stream=ctx.plan.stream)

    def save(state: DrafterState) -> None:
        record = msgspec.structs.replace(
            identity,
            step=state.step,
            cursors=state.ledger.cursors(),
            eval_step=state.evaluated_step,
        )
        save_training(
            ctx.checkpoints, record, trainee.model, ctx.plan.spec, trainee.optimizer,
            trainee.scheduler, ctx.config.run.keep_checkpoints,
        )  # fmt: skip

    return save


def _weights_digest(model: torch.nn.Module) -> str:
    """A hash of every parameter's bytes, in order: the same on every drafter rank while
    their gradients are reduced together (the logs show it; a difference is a desync)."""
    digest = hashlib.blake2b(digest_size=8)
    for parameter in model.parameters():
        digest.update(parameter.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()
