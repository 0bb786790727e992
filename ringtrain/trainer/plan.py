"""A run's plan: the inputs resolved and validated before any rank touches a GPU.

Everything that can be wrong with the inputs (config, target directory, tapped layers,
dataset, drafter shape, /dev/shm) is checked on every rank, so bad input fails in
seconds with a message that names the problem and the fix. The plan also derives what
every rank must agree on: the node's ring spec and each target's batch stream.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ringtrain.config import Config, ConfigError
from ringtrain.data import BatchStream, DatasetError, TokenDataset, open_dataset
from ringtrain.drafter import DrafterSpec, drafter_spec_from_target, latest_checkpoint
from ringtrain.drafter.checkpoint import checkpoint_spec
from ringtrain.monitor.sinks import check_report_to
from ringtrain.ring import Ring, RingError, RingSpec
from ringtrain.ring.names import ring_id
from ringtrain.target import TargetLoadError, read_target_config
from ringtrain.target.taps import check_tap_layers, default_tap_layers
from ringtrain.trainer.builtin import prepare_builtin_inputs
from ringtrain.trainer.roles import RankInfo

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
    /dev/shm can hold the ring, and that the run.report_to packages are installed."""
    check_report_to(config.run.report_to)
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


def eval_batches_per_round(config: Config, plan: Plan, info: RankInfo) -> int:
    """Held-out batches of one evaluation round over every target (0: no evaluation)."""
    if not config.run.eval_every or plan.eval_dataset is None:
        return 0
    targets = info.num_nodes * info.targets_per_node
    return batch_stream(config, plan.eval_dataset, 0, targets).batches_per_rank * targets


def ring_spec(config: Config, info: RankInfo, run_dir: Path, plan: Plan) -> RingSpec:
    """The spec of this node's ring, identical on every local rank."""
    roles = ["target"] * info.targets_per_node + ["drafter"] * info.drafters_per_node
    first = info.node_rank * info.local_world_size
    return RingSpec(
        run_id=ring_id(config.run.name, str(run_dir), info.node_rank),
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
        progress_timeout_s=config.ring.progress_timeout_s,
        startup_timeout_s=config.ring.startup_timeout_s,
        lock_dir=config.ring.lock_dir,
    )
