"""One rank's whole run once its inputs are validated (trainer/plan.py): the ring, the role's loop.

Local rank 0 of each node creates the node's ring and the others attach; a watchdog
turns a peer's death into this rank's exit; then the rank runs its role's loop and
leaves the ring cleanly, or marks it failed so every peer stops within seconds.
"""

from __future__ import annotations

import hashlib
import os
import time
from functools import partial
from pathlib import Path

import msgspec
import torch
import torch.distributed as dist

from ringtrain.config import Config
from ringtrain.drafter import (
    DrafterSpec,
    FrozenHead,
    ResumeRecord,
    StreamCursor,
    build_optimizer,
    latest_checkpoint,
    load_checkpoint,
    load_frozen_head,
    read_resume_record,
    save_checkpoint,
    seeded_drafter,
)
from ringtrain.drafter.optim import resume_settings, saved_schedule_length, schedule_at
from ringtrain.drafter.retention import prune_checkpoints
from ringtrain.monitor.sinks import open_sinks
from ringtrain.ring import PeerDied, Ring
from ringtrain.target import TargetRunner, load_target
from ringtrain.trainer import phases
from ringtrain.trainer.batch_meta import BatchMeta
from ringtrain.trainer.drafter_loop import DrafterLoop, DrafterState, Trainee
from ringtrain.trainer.groups import RankGroups
from ringtrain.trainer.heldout import EvalRounds, EvalSchedule
from ringtrain.trainer.ledger import BatchLedger
from ringtrain.trainer.logs import FILE_ONLY, MetricsWriter, get_logger, last_evaluation
from ringtrain.trainer.outcome import (
    DONE,
    STOPPED,
    Outcome,
    env_rank,
    launched,
    peer_failure,
    report_outcome,
)
from ringtrain.trainer.plan import Plan, batch_stream, eval_batches_per_round, ring_spec
from ringtrain.trainer.progress import LeadReporter, Progress
from ringtrain.trainer.report import stop_line
from ringtrain.trainer.roles import RankInfo
from ringtrain.trainer.run_dir import read_run_id
from ringtrain.trainer.signals import StopRequest
from ringtrain.trainer.target_group import GroupDecisions
from ringtrain.trainer.target_loop import BatchOrder, run_target_loop
from ringtrain.trainer.target_progress import TargetProgress

# How long a failed rank looks for a peer's death before reporting its own error, and how
# often it looks (see _peer_death).
PEER_DEATH_GRACE_S = 2.0
PEER_DEATH_POLL_S = 0.05


def join_ring(config: Config, info: RankInfo, run_dir: Path, plan: Plan) -> Ring:
    """Local rank 0 creates the node's ring, the others attach, then names are unlinked."""
    spec = ring_spec(config, info, run_dir, plan)
    ring = Ring.create(spec, info.local_rank, info.device) if info.local_rank == 0 else None
    dist.barrier()
    if ring is None:
        ring = Ring.attach(spec.run_id, info.local_rank, info.device)
    dist.barrier()
    ring.unlink()
    ring.describe_work(phases.WORK[info.role])
    get_logger().info("ring %s ready: transport %s", spec.run_id, ring.transport)
    return ring


def _die_on_peer_death(ring: Ring, run_dir: Path):
    def on_dead(exc: PeerDied) -> None:
        # Under ringtrain-launch the launcher says it once, naming the rank that failed.
        get_logger().error("%s; stopping this rank", exc, extra=FILE_ONLY if launched() else None)
        for handler in get_logger().handlers:
            handler.flush()
        # Ranks that see this one abort then report the original death, not just the abort.
        ring.set_error(str(exc))
        ring.close(clean=False)
        report_outcome(peer_failure(env_rank(), exc, run_dir, None))
        os._exit(1)

    return on_dead


def run_session(
    config: Config,
    info: RankInfo,
    run_dir: Path,
    plan: Plan,
    groups: RankGroups,
    stop: StopRequest,
    resume: bool,
) -> Outcome:
    """Join the ring and run this rank's role; returns how it ended (exit code 0)."""
    log = get_logger()
    checkpoints = run_dir / "checkpoints"
    resume_from = latest_checkpoint(checkpoints, read_run_id(run_dir)) if resume else None
    if resume and resume_from is None:
        log.warning("--resume: no complete checkpoint under %s; starting fresh", checkpoints)
    ring = join_ring(config, info, run_dir, plan)
    ring.start_watchdog(_die_on_peer_death(ring, run_dir))
    step = None
    try:
        if info.is_target:
            _run_target(config, info, plan, ring, resume_from, groups, stop)
        else:
            step = _run_drafter(
                config, info, run_dir, plan, ring, resume_from, groups.drafters, stop
            )
        if stop.requested:
            # torchrun sends SIGTERM to every rank when one of them died: that is a failure.
            ring.check_peers()
    except BaseException as exc:
        died = _peer_death(ring)
        if died is not None:
            # A collective or a copy failed because a peer died first (gloo/NCCL report
            # only "connection closed"): report the death, which names the rank.
            ring.set_error(str(died))
            ring.close(clean=False)
            raise died from exc
        ring.set_error(f"{type(exc).__name__}: {exc}")
        ring.close(clean=False)
        raise
    ring.close(clean=True)
    return _session_end(info, run_dir, stop, step if info.is_lead_drafter else None)


def _session_end(info: RankInfo, run_dir: Path, stop: StopRequest, step: int | None) -> Outcome:
    """How this rank's session ended; `step`: the lead drafter's last step (None on the
    other ranks). A stop on the lead drafter names the step and the newest checkpoint
    (ringtrain-launch prints it with the command to resume; under plain torchrun the lead
    drafter says it)."""
    if not stop.requested:
        return Outcome(info.rank, 0, DONE, step=step)
    checkpoint = None
    if step is not None:
        checkpoint = latest_checkpoint(run_dir / "checkpoints", read_run_id(run_dir))
    outcome = Outcome(
        info.rank,
        0,
        STOPPED,
        signal=stop.signal_name,
        step=step,
        checkpoint=None if checkpoint is None else str(checkpoint),
    )
    if step is not None:
        line = stop_line(
            step, stop.signal_name, outcome.checkpoint, "the same command and --resume"
        )
        get_logger().info("%s", line, extra=FILE_ONLY if launched() else None)
    return outcome


def _peer_death(ring: Ring) -> PeerDied | None:
    """The death of a peer that this rank's failure may come from, looked for during
    PEER_DEATH_GRACE_S: a collective with a killed peer fails as soon as the peer's
    sockets close, a moment before its process leaves the process table."""
    deadline = time.monotonic() + PEER_DEATH_GRACE_S
    while True:
        try:
            ring.check_peers()
        except PeerDied as died:
            return died
        if time.monotonic() >= deadline:
            return None
        time.sleep(PEER_DEATH_POLL_S)


def _run_target(
    config: Config,
    info: RankInfo,
    plan: Plan,
    ring: Ring,
    resume_from: Path | None,
    groups: RankGroups,
    stop: StopRequest,
) -> None:
    """Produce batches as this rank's producer (its target group, when target_tp > 1):
    the group's stream, cursor and evaluation shard are keyed by the group index."""
    log = get_logger()
    producer, producers = info.group_index, info.producer_count
    cursor, evaluated_step, resumed_step = StreamCursor(), 0, 0
    if resume_from is not None:
        record = read_resume_record(resume_from)
        cursor, evaluated_step = record.cursors.get(producer, cursor), record.evaluated_step
        resumed_step = record.step
        log.info("resuming at batch %d of this producer's stream", cursor.start)
        ring.start_at(resumed_step)
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
    ring.set_phase(phases.LOADING_TARGET)
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
        group=groups.target,
    )
    runner = TargetRunner(model, info.device)
    decisions = GroupDecisions(ring, groups.target_control, info.group_ranks[0])
    order = BatchOrder(stream, schedule)
    progress = TargetProgress(ring, config.run.log_every, resumed_step)
    run_target_loop(ring, runner, order, decisions, config.data.bucket, producer, stop, progress)


def _run_drafter(
    config: Config,
    info: RankInfo,
    run_dir: Path,
    plan: Plan,
    ring: Ring,
    resume_from: Path | None,
    group: dist.ProcessGroup | None,
    stop: StopRequest,
) -> int:
    """Train as one of the drafters (the lead one also reports and checkpoints); returns
    the run's step reached."""
    ring.set_phase(phases.BUILDING_DRAFTER)
    trainee = _build_trainee(config, info.device, plan)
    state = _resumed_state(config, trainee, resume_from, info.device)
    ring.start_at(state.step)
    reporter, save = None, ring.phase_marker(phases.CHECKPOINT)  # others wait for the lead's save
    if info.is_lead_drafter:
        metrics_path = run_dir / "metrics.jsonl"
        metrics = MetricsWriter(
            metrics_path,
            open_sinks(config, run_dir),
            resumed_step=state.step,
            evaluated_step=state.evaluated_step,
        )
        for note in metrics.notes:
            get_logger().info("%s", note)
        progress = Progress(config, ring, state.step, last_evaluation(metrics_path))
        reporter = LeadReporter(metrics, progress)
        identity = ResumeRecord(step=0, run_id=read_run_id(run_dir), stream=plan.stream)
        save = ring.announcing(
            phases.CHECKPOINT,
            partial(
                _save_checkpoint,
                run_dir / "checkpoints",
                trainee,
                plan.spec,
                identity,
                keep=config.run.keep_checkpoints,
            ),
        )
    loop = DrafterLoop(
        config,
        ring.consumer(info.device, BatchMeta).take,
        ring,
        trainee,
        info.role_index,
        info.role_count,
        group,
        eval_batches_per_round(config, plan, info),
    )
    ring.set_phase(phases.FIRST_STEP)
    loop.train(state, stop, reporter, save)
    get_logger().info("drafter weights digest: %s", _weights_digest(trainee.model))
    if reporter is not None:
        reporter.close()
    return state.step


def _weights_digest(model: torch.nn.Module) -> str:
    """A hash of every parameter's bytes, in order: the same on every drafter rank while
    their gradients are reduced together (the logs show it; a difference is a desync)."""
    digest = hashlib.blake2b(digest_size=8)
    for parameter in model.parameters():
        digest.update(parameter.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _build_trainee(config: Config, device: torch.device, plan: Plan) -> Trainee:
    """A fresh drafter on `device` (initialised from run.seed: alike on every drafter rank),
    the target's frozen head, the optimizer and schedule."""
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


def _resumed_state(
    config: Config, trainee: Trainee, resume_from: Path | None, device: torch.device
) -> DrafterState:
    """Step 0 with an empty ledger, or the checkpoint's state loaded into `trainee`: the
    weights, the optimiser's moments and the RNG states as saved; the optimiser settings
    and the schedule (over run.max_steps, from the saved step) as configured."""
    if resume_from is None:
        return DrafterState(step=0, ledger=BatchLedger())
    log = get_logger()
    log.info("loading checkpoint %s", resume_from)
    checkpoint = load_checkpoint(resume_from, device)
    trainee.model.load_state_dict(checkpoint.model.state_dict())
    checkpoint.restore(trainee.optimizer)
    changes = resume_settings(trainee.optimizer, config.optim, checkpoint.saved_schedule)
    total = config.run.max_steps
    saved_total, _ = saved_schedule_length(checkpoint.saved_schedule)
    if saved_total is not None and saved_total != total:
        changes.append(f"run.max_steps {saved_total} -> {total}")
    trainee.scheduler = schedule_at(trainee.optimizer, config.optim, total, checkpoint.step)
    log.info(
        "resumed from %s at step %d; schedule: step %d of %d, lr %.4g (optim.lr %g; %s)",
        resume_from, checkpoint.step, checkpoint.step, total,
        trainee.scheduler.get_last_lr()[0], config.optim.lr,
        trainee.scheduler.lr_lambdas[0].describe(),
    )  # fmt: skip
    for change in changes:
        log.info("resume applies the config's setting: %s", change)
    record = checkpoint.record
    return DrafterState(checkpoint.step, BatchLedger(record.cursors), record.evaluated_step)


def _save_checkpoint(
    root: Path,
    trainee: Trainee,
    spec: DrafterSpec,
    identity: ResumeRecord,
    state: DrafterState,
    *,
    keep: int,
) -> None:
    """Checkpoint `state`; its resume record is `identity` (the run id, the batch
    sequence) with the state's step, data cursors and last completed held-out round.
    Then all but the newest `keep` checkpoints are deleted (run.keep_checkpoints; 0 keeps
    all)."""
    record = msgspec.structs.replace(
        identity,
        step=state.step,
        cursors=state.ledger.cursors(),
        eval_step=state.evaluated_step,
    )
    path = save_checkpoint(
        root, state.step, trainee.model, spec, trainee.optimizer, trainee.scheduler, record
    )
    get_logger().info("checkpoint written: %s", path)
    prune_checkpoints(root, keep, path)
