"""One rank's whole run once its inputs are validated (trainer/plan.py): the ring, the role's loop.

Local rank 0 of each node creates the node's ring and the others attach; a watchdog
turns a peer's death into this rank's exit; then the rank runs its role's loop and
leaves the ring cleanly, or marks it failed so every peer stops within seconds.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist

from ringtrain.config import Config
from ringtrain.drafter import (
    DFlashDrafter,
    FrozenHead,
    build_optimizer,
    latest_checkpoint,
    load_checkpoint,
    load_frozen_head,
    read_checkpoint_extra,
    save_checkpoint,
)
from ringtrain.ring import PeerDied, Ring
from ringtrain.target import TargetRunner, load_target
from ringtrain.trainer.drafter_loop import DrafterLoop, DrafterState, StepRecord
from ringtrain.trainer.evaluation import EvalSchedule
from ringtrain.trainer.ledger import BatchLedger
from ringtrain.trainer.logs import MetricsWriter, get_logger
from ringtrain.trainer.plan import Plan, batch_stream, ring_spec
from ringtrain.trainer.progress import Progress
from ringtrain.trainer.roles import RankInfo
from ringtrain.trainer.signals import StopRequest
from ringtrain.trainer.target_loop import run_target_loop


def join_ring(config: Config, info: RankInfo, run_dir: Path, plan: Plan) -> Ring:
    """Local rank 0 creates the node's ring, the others attach, then names are unlinked."""
    spec = ring_spec(config, info, run_dir, plan)
    ring = Ring.create(spec, info.local_rank, info.device) if info.local_rank == 0 else None
    dist.barrier()
    if ring is None:
        ring = Ring.attach(spec.run_id, info.local_rank, info.device)
    dist.barrier()
    ring.unlink()
    get_logger().info("ring %s ready: transport %s", spec.run_id, ring.transport)
    return ring


def _die_on_peer_death(ring: Ring):
    def on_dead(exc: PeerDied) -> None:
        get_logger().error("%s; stopping this rank", exc)
        for handler in get_logger().handlers:
            handler.flush()
        # Ranks that see this one abort then report the original death, not just the abort.
        ring.set_error(str(exc))
        ring.close(clean=False)
        os._exit(1)

    return on_dead


def run_session(
    config: Config,
    info: RankInfo,
    run_dir: Path,
    plan: Plan,
    group: dist.ProcessGroup | None,
    stop: StopRequest,
    resume: bool,
) -> int:
    """Join the ring and run this rank's role; returns the process exit code."""
    log = get_logger()
    checkpoints = run_dir / "checkpoints"
    resume_from = latest_checkpoint(checkpoints) if resume else None
    if resume and resume_from is None:
        log.warning("--resume: no complete checkpoint under %s; starting fresh", checkpoints)
    ring = join_ring(config, info, run_dir, plan)
    ring.start_watchdog(_die_on_peer_death(ring))
    try:
        if info.is_target:
            _run_target(config, info, plan, ring, resume_from, stop)
        else:
            _run_drafter(config, info, run_dir, plan, ring, resume_from, group, stop)
        if stop.requested:
            # torchrun sends SIGTERM to every rank when one of them died: that is a failure.
            ring.check_peers()
    except BaseException as exc:
        try:
            ring.check_peers()
        except PeerDied as died:
            # A collective or a copy failed because a peer died first (gloo/NCCL report
            # only "connection closed"): report the death, which names the rank.
            ring.set_error(str(died))
            ring.close(clean=False)
            raise died from exc
        ring.set_error(f"{type(exc).__name__}: {exc}")
        ring.close(clean=False)
        raise
    ring.close(clean=True)
    return 0


def _run_target(
    config: Config,
    info: RankInfo,
    plan: Plan,
    ring: Ring,
    resume_from: Path | None,
    stop: StopRequest,
) -> None:
    log = get_logger()
    cursor = {"start": 0, "skip": []}
    resumed_step = 0
    if resume_from is not None:
        extra = read_checkpoint_extra(resume_from)
        cursor = extra["cursors"].get(str(info.role_index), cursor)
        resumed_step = extra["step"]
        log.info("resuming at batch %d of this target's stream", cursor["start"])
    schedule = None
    if config.run.eval_every and plan.eval_dataset is not None:
        held_out = batch_stream(config, plan.eval_dataset, info.role_index, info.role_count)
        schedule = EvalSchedule(held_out, config.run.eval_every, resumed_step)
    stream = batch_stream(
        config, plan.dataset, info.role_index, info.role_count, cursor["start"], cursor["skip"]
    )
    model = load_target(
        plan.target_path,
        tap_layers=plan.tap_layers,
        num_taps=len(plan.tap_layers),
        device=info.device,
        dtype=plan.hidden_dtype,
        random_weights=config.target.random_weights,
        compile=config.target.compile,
    )
    runner = TargetRunner(model, info.device)
    run_target_loop(ring, runner, stream, schedule, config.data.bucket, info.role_index, stop)


def _run_drafter(
    config: Config,
    info: RankInfo,
    run_dir: Path,
    plan: Plan,
    ring: Ring,
    resume_from: Path | None,
    group: dist.ProcessGroup | None,
    stop: StopRequest,
) -> None:
    log = get_logger()
    device = info.device
    if config.target.random_weights:
        head = FrozenHead.random(
            plan.spec.vocab_size, plan.spec.hidden_size, device, plan.hidden_dtype
        )
    else:
        log.info("loading frozen embedding and LM head from %s", plan.target_path)
        head = load_frozen_head(plan.target_path, device, plan.hidden_dtype)
    with torch.device(device):  # initialised where it trains: a billion values on CPU take long
        model = DFlashDrafter(plan.spec)
    optimizer, scheduler = build_optimizer(model, config.optim, config.run.max_steps)
    state = DrafterState(step=0, ledger=BatchLedger())
    if resume_from is not None:
        checkpoint = load_checkpoint(resume_from, device)
        model.load_state_dict(checkpoint.model.state_dict())
        checkpoint.restore(optimizer, scheduler)
        state = DrafterState(step=checkpoint.step, ledger=BatchLedger(checkpoint.extra["cursors"]))
        log.info("resumed from %s at step %d", resume_from, state.step)
    lead = info.is_lead_drafter
    metrics = MetricsWriter(run_dir / "metrics.jsonl") if lead else None
    progress = Progress(config, ring) if lead else None

    def save(current: DrafterState) -> None:
        if not lead:
            return
        path = save_checkpoint(
            run_dir / "checkpoints",
            current.step,
            model,
            plan.spec,
            optimizer,
            scheduler,
            extra={
                "cursors": current.ledger.state(),
                "tap_layers": plan.tap_layers,
                "step": current.step,
            },
        )
        log.info("checkpoint written: %s", path)

    def on_step(record: StepRecord) -> None:
        if progress is not None:
            progress.step(record)

    def on_eval(step: int, evaluated: dict) -> None:
        if metrics is not None:
            metrics.write({"event": "eval", "step": step, **evaluated})
        if progress is not None:
            progress.evaluation(step, evaluated)

    eval_batches = 0
    if config.run.eval_every and plan.eval_dataset is not None:
        targets = info.num_nodes * info.targets_per_node
        eval_batches = (
            batch_stream(config, plan.eval_dataset, 0, targets).batches_per_rank * targets
        )
    loop = DrafterLoop(
        config,
        ring,
        model,
        head,
        optimizer,
        scheduler,
        info.role_index,
        info.role_count,
        group,
        eval_batches,
    )
    state = loop.train(state, stop, on_step, on_eval, save, metrics)
    if progress is not None:
        progress.summary()
    if metrics is not None:
        metrics.close()
