"""One rank's whole run: inputs, validation, the ring, and the role's loop.

Order matters for users: everything that can be wrong with the inputs (config, target
directory, tapped layers, dataset, drafter shape, /dev/shm) is checked on every rank
before any model touches a GPU, so bad input fails in seconds with a message that names
the problem and the fix.
"""

from __future__ import annotations

import os
import re
import zlib
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from ringtrain.config import Config, ConfigError
from ringtrain.data import BatchStream, DatasetError, TokenDataset, open_dataset
from ringtrain.drafter import (
    DFlashDrafter,
    DrafterSpec,
    FrozenHead,
    build_optimizer,
    drafter_spec_from_target,
    latest_checkpoint,
    load_checkpoint,
    load_frozen_head,
    read_checkpoint_extra,
    save_checkpoint,
)
from ringtrain.drafter.checkpoint import checkpoint_spec
from ringtrain.ring import PeerDied, Ring, RingError, RingSpec
from ringtrain.target import TargetLoadError, TargetRunner, load_target, read_target_config
from ringtrain.target.taps import check_tap_layers, default_tap_layers
from ringtrain.trainer.builtin import prepare_builtin_inputs
from ringtrain.trainer.drafter_loop import DrafterLoop, DrafterState, StepRecord
from ringtrain.trainer.evaluation import EvalSchedule
from ringtrain.trainer.ledger import BatchLedger
from ringtrain.trainer.logs import MetricsWriter, get_logger
from ringtrain.trainer.progress import Progress
from ringtrain.trainer.roles import RankInfo
from ringtrain.trainer.signals import StopRequest
from ringtrain.trainer.target_loop import run_target_loop

# Errors that mean "the inputs are wrong": reported as such, exit code 2.
INPUT_ERRORS = (ConfigError, DatasetError, TargetLoadError, RingError)


@dataclass(frozen=True)
class Plan:
    """The validated inputs of a run, identical on every rank."""

    target_path: Path
    target_config: Any
    tap_layers: list[int]
    dataset: TokenDataset
    spec: DrafterSpec
    hidden_dtype: torch.dtype
    max_docs: int  # most documents one batch can hold (sizes the ring's slots)
    eval_dataset: TokenDataset | None  # held-out split (None: no evaluation)


def ring_run_id(config: Config, run_dir: Path, node_rank: int) -> str:
    """A node-unique, filesystem-safe ring name prefix for this run."""
    name = re.sub(r"[^A-Za-z0-9_-]", "_", config.run.name)[:24]
    digest = zlib.crc32(str(run_dir).encode()) & 0xFFFFFFFF
    return f"{name}-{digest:08x}-n{node_rank}"


def check_resume_spec(checkpoint: Path, spec: DrafterSpec) -> None:
    """Raise ConfigError if `checkpoint` holds a drafter of another shape than `spec`."""
    saved = checkpoint_spec(checkpoint)
    if saved == spec:
        return
    differences = ", ".join(
        f"{field} {getattr(saved, field)} in the checkpoint vs {getattr(spec, field)} now"
        for field in spec.__struct_fields__
        if getattr(saved, field) != getattr(spec, field)
    )
    raise ConfigError(
        f"--resume: checkpoint {checkpoint} was trained for another drafter shape "
        f"({differences}); resume with the original config and target, or start a new "
        "run directory"
    )


def validate_inputs(config: Config, info: RankInfo, run_dir: Path, resume: bool = False) -> Plan:
    """Resolve the target and dataset and check that they fit together (no GPU work).

    Also checks, with `resume`, that the newest checkpoint fits this drafter, and that
    /dev/shm can hold the ring."""
    target_path, data_path, eval_path = prepare_builtin_inputs(config, run_dir)
    target_config = read_target_config(target_path, weights=not config.target.random_weights)
    num_layers = target_config.num_hidden_layers
    try:
        taps = config.target.tap_layers or default_tap_layers(num_layers, config.target.num_taps)
        taps = check_tap_layers(taps, num_layers, f"target.tap_layers ({target_path})")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    datasets = [
        open_dataset(
            path,
            max_len=config.data.max_len,
            truncate=config.data.truncate,
            block_size=config.drafter.block_size,
            vocab_size=target_config.vocab_size,
        )
        for path in (data_path, eval_path)
        if path is not None
    ]
    dataset, eval_dataset = datasets[0], (datasets[1] if eval_path is not None else None)
    if config.run.eval_every and eval_dataset is None:
        raise ConfigError(
            f"run.eval_every = {config.run.eval_every} but no held-out split is given: set "
            "data.eval_path to a dataset directory, or run.eval_every = 0"
        )
    if config.data.max_len > config.data.token_budget:
        raise ConfigError(
            f"data.max_len = {config.data.max_len} exceeds data.token_budget = "
            f"{config.data.token_budget}: a batch must hold the longest row; raise the "
            "budget or lower max_len"
        )
    try:
        spec = drafter_spec_from_target(target_config, config.drafter, taps)
    except ValueError as exc:
        raise ConfigError(f"[drafter] does not fit the target {target_path}: {exc}") from None
    if resume and (checkpoint := latest_checkpoint(run_dir / "checkpoints")) is not None:
        check_resume_spec(checkpoint, spec)
    cuda = info.device.type == "cuda"
    wanted = config.target.dtype
    dtype = torch.bfloat16 if wanted == "bfloat16" or (wanted == "auto" and cuda) else torch.float32
    splits = [d for d in (dataset, eval_dataset) if d is not None]
    max_docs = max(batch_stream(config, split, 0, 1).max_docs for split in splits)
    plan = Plan(target_path, target_config, taps, dataset, spec, dtype, max_docs, eval_dataset)
    try:
        ring = ring_spec(config, info, run_dir, plan)
    except ValueError as exc:
        raise ConfigError(f"[ring]: {exc}") from None
    Ring.check_space(ring, info.device)
    return plan


def batch_stream(
    config: Config,
    dataset: TokenDataset,
    rank: int,
    world: int,
    start: int = 0,
    skip: Collection[int] = (),
) -> BatchStream:
    """Target rank `rank` of `world`'s batches of `dataset` under the [data] settings."""
    return BatchStream(
        dataset,
        token_budget=config.data.token_budget,
        bucket=config.data.bucket,
        seed=config.data.seed,
        rank=rank,
        world=world,
        start=start,
        skip=skip,
    )


def ring_spec(config: Config, info: RankInfo, run_dir: Path, plan: Plan) -> RingSpec:
    """The spec of this node's ring, identical on every local rank."""
    roles = ["target"] * info.targets_per_node + ["drafter"] * info.drafters_per_node
    first = info.node_rank * info.local_world_size
    return RingSpec(
        run_id=ring_run_id(config, run_dir, info.node_rank),
        generation=info.restart_count,
        roles=roles,
        global_ranks=[first + i for i in range(info.local_world_size)],
        slots_per_producer=config.ring.slots_per_producer,
        max_tokens=config.data.token_budget,
        max_docs=plan.max_docs,
        hidden_width=len(plan.tap_layers) * plan.spec.hidden_size,
        hidden_dtype=plan.hidden_dtype,
        transport=config.ring.transport,
        wait_timeout_s=config.ring.wait_timeout_s,
        heartbeat_timeout_s=config.ring.heartbeat_timeout_s,
        lock_dir=config.ring.lock_dir,
    )


def open_ring(config: Config, info: RankInfo, run_dir: Path, plan: Plan) -> Ring:
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
    ring = open_ring(config, info, run_dir, plan)
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
