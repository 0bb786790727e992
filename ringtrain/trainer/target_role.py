"""A target rank's session: its producer's batch stream (resumed at the checkpoint's
cursor), its share of the held-out rounds, the target loaded, and the target loop run."""

from __future__ import annotations

from ringtrain.checkpoint import StreamCursor, read_resume_record
from ringtrain.ring import Ring
from ringtrain.target import TargetRunner, load_target
from ringtrain.trainer import phases
from ringtrain.trainer.context import SessionContext
from ringtrain.trainer.heldout import EvalRounds, EvalSchedule
from ringtrain.trainer.logs import get_logger
from ringtrain.trainer.plan import batch_stream
from ringtrain.trainer.target_group import GroupDecisions
from ringtrain.trainer.target_loop import BatchOrder, run_target_loop
from ringtrain.trainer.target_progress import TargetProgress


def run_target(ctx: SessionContext, ring: Ring) -> None:
    """Produce batches as this rank's producer (its target group, when target_tp > 1):
    the group's stream, cursor and evaluation shard are keyed by the group index."""
    config, info, plan = ctx.config, ctx.info, ctx.plan
    producer, producers = info.group_index, info.producer_count
    cursor, evaluated_step, resumed_step = StreamCursor(), 0, 0
    if plan.resume_from is not None:
        record = read_resume_record(plan.resume_from)
        cursor, evaluated_step = record.cursors.get(producer, cursor), record.evaluated_step
        resumed_step = record.step
        get_logger().info("resuming at batch %d of this producer's stream", cursor.start)
        ring.own_row.start_at(resumed_step)
    schedule = None
    if config.run.eval_every and plan.eval_dataset is not None:
        held_out = batch_stream(config, plan.eval_dataset, producer, producers)
        rounds = EvalRounds(config.run.eval_every, config.run.max_steps)
        schedule = EvalSchedule(
            held_out,
            rounds,
            evaluated_step,
            resumed_step,
            producers=len(ring.spec.producers),
            consumers=len(ring.spec.consumers),
        )
    stream = batch_stream(config, plan.dataset, producer, producers, cursor.start, cursor.skip)
    ring.own_row.set_phase(phases.LOADING_TARGET)
    model = load_target(
        plan.target_path,
        tap_layers=plan.tap_layers,
        num_taps=len(plan.tap_layers),
        device=info.device,
        dtype=plan.hidden_dtype,
        attn_implementation=config.target.attn_implementation,
        random_weights=config.target.random_weights,
        compile=config.target.compile,
        compile_moe=config.target.compile_moe,
        linear_attention=config.target.linear_attention,
        group=ctx.groups.target,
    )
    runner = TargetRunner(model, info.device)
    decisions = GroupDecisions(ring, ctx.groups.target_control, info.group_ranks[0])
    order = BatchOrder(stream, schedule)
    progress = TargetProgress(ring, config.run.log_every, resumed_step)
    run_target_loop(
        ring, runner, order, decisions, config.data.bucket, producer, ctx.stop, progress
    )
