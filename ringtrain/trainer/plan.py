"""A run's plan: the inputs resolved and validated before any rank touches a GPU.

Everything that can be wrong with the inputs (config, target directory, tapped layers,
dataset, drafter shape, /dev/shm) is checked on every rank, so bad input fails in
seconds with a message that names the problem and the fix. The plan also derives what
every rank must agree on: the node's ring spec and each target's batch stream.

With --resume the plan names the newest complete checkpoint the session continues from
(`Plan.resume_from`), once it passed the checks of checkpoint/resume_checks.py: the same
drafter shape, batch sequence and optimiser.
"""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import torch

from ringtrain.batch import slot_fields
from ringtrain.checkpoint.resume_checks import check_resume, stream_identity
from ringtrain.checkpoint.resume_record import CheckpointFormatError, StreamIdentity
from ringtrain.checkpoint.verify import checkpoint_spec, latest_checkpoint
from ringtrain.config import Config, ConfigError
from ringtrain.data import BatchStream, DatasetError, TokenDataset, open_dataset
from ringtrain.data.batching import max_docs_per_batch
from ringtrain.data.prepare import load_tokenizer
from ringtrain.drafter import DrafterSpec, drafter_spec_from_target
from ringtrain.drafter.config import DrafterConfig
from ringtrain.drafter.limits import check_limits
from ringtrain.drafter.mask_token import choose_mask_token
from ringtrain.monitor.sinks import check_report_to
from ringtrain.ring import Ring, RingError, RingSpec
from ringtrain.ring.names import ring_id
from ringtrain.ring.spec import dtype_name
from ringtrain.target import TargetLoadError, TargetModelDir, read_target_config
from ringtrain.target.linear_attention import choose_linear_attention
from ringtrain.target.loader import check_target_group, resolve_dtype
from ringtrain.target.structure import check_structure
from ringtrain.target.taps import check_tap_layers, default_tap_layers
from ringtrain.trainer.builtin import prepare_builtin_inputs
from ringtrain.trainer.logs import get_logger
from ringtrain.trainer.roles import END_OF_ROLE, RankInfo, local_role
from ringtrain.trainer.run_dir import read_run_id

# Errors that mean "the inputs are wrong": reported as such, exit code 2.
INPUT_ERRORS = (ConfigError, DatasetError, TargetLoadError, RingError, CheckpointFormatError)


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
    stream: StreamIdentity  # what decides the batch sequence (stream_identity)
    resume_from: Path | None  # the checkpoint --resume continues from (None: a fresh start)


def validate_inputs(config: Config, info: RankInfo, run_dir: Path, resume: bool = False) -> Plan:
    """Resolve the target and dataset and check that they fit together (no GPU work).

    Also checks, with `resume`, that the newest checkpoint fits this drafter, and that
    /dev/shm can hold the ring, and that the run.report_to packages are installed."""
    check_report_to(config.run.report_to)
    target_path, data_path, eval_path = prepare_builtin_inputs(config, run_dir)
    target_config, taps = _target_and_taps(config, target_path, info)
    dataset, eval_dataset = _datasets(config, target_config.vocab_size, data_path, eval_path)
    checkpoints = run_dir / "checkpoints"
    checkpoint = latest_checkpoint(checkpoints, read_run_id(run_dir)) if resume else None
    if resume and checkpoint is None:
        get_logger().warning(
            "--resume: no complete checkpoint under %s; starting fresh", checkpoints
        )
    spec = _drafter_spec(config, target_path, target_config, taps, info, checkpoint)
    try:  # values the drafter cannot hold, before the ring is up
        check_limits(config.drafter, config.optim, spec, config.data.token_budget, info.device)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    stream = stream_identity(config, dataset, info.num_nodes * info.targets_per_node)
    if checkpoint is not None:
        check_resume(checkpoint, spec, stream, config.optim, announce=info.rank == 0)
    dtype = resolve_dtype(config.target.dtype, info.device)
    splits = [d for d in (dataset, eval_dataset) if d is not None]
    data = config.data
    max_docs = max(max_docs_per_batch(split, data.token_budget, data.bucket) for split in splits)
    plan = Plan(
        target_path,
        target_config,
        taps,
        dataset,
        spec,
        dtype,
        max_docs,
        eval_dataset,
        stream,
        checkpoint,
    )
    try:
        ring = ring_spec(config, info, run_dir, plan)
    except ValueError as exc:
        raise ConfigError(f"[ring]: {exc}") from None
    if not Path(ring.lock_dir).is_dir():
        raise ConfigError(
            f"ring.lock_dir = {ring.lock_dir!r} is not a directory: create it, or leave "
            "ring.lock_dir at its default (/dev/shm)"
        )
    Ring.check_space(ring, info.device)  # before the batch buffers of the budget exist
    for split in splits:
        batch_stream(config, split, 0, 1)  # every row fits a batch; enough batches per rank
    return plan


def _datasets(
    config: Config, vocab_size: int, data_path: Path, eval_path: Path | None
) -> tuple[TokenDataset, TokenDataset | None]:
    """The training and held-out datasets, opened and checked against the config."""
    datasets = [
        open_dataset(
            path,
            max_len=config.data.max_len,
            truncate=config.data.truncate,
            block_size=config.drafter.block_size,
            vocab_size=vocab_size,
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
    return dataset, eval_dataset


def _drafter_spec(
    config: Config,
    target_path: Path,
    target_config: Any,
    taps: list[int],
    info: RankInfo,
    checkpoint: Path | None,
) -> DrafterSpec:
    """The drafter's spec for this target; a resume's auto mask token is the checkpoint's."""
    resumed_mask = checkpoint_spec(checkpoint).mask_token_id if checkpoint else None
    drafter = resolve_mask_token(
        config.drafter, target_path, target_config.vocab_size, info.is_lead_drafter, resumed_mask
    )
    try:
        return drafter_spec_from_target(target_config, drafter, taps)
    except ValueError as exc:
        raise ConfigError(f"[drafter] does not fit the target {target_path}: {exc}") from None


def resolve_mask_token(
    drafter: DrafterConfig,
    target_path: Path,
    vocab_size: int,
    announce: bool,
    resumed_mask: int | None = None,
) -> DrafterConfig:
    """The [drafter] config with drafter.mask_token_id = -1 (auto) replaced by the id
    chosen from the target's tokenizer (drafter/mask_token.py), or on a resume by the
    checkpoint's `resumed_mask` (what the drafter was trained with). Where `announce` (the
    lead drafter), the choice is logged: as a warning when it may be an ordinary token."""
    if drafter.mask_token_id >= 0:
        return drafter
    # A checkpoint's id outside this target's vocabulary belongs to another target: the
    # resume check then refuses the checkpoint by name (not this setting).
    if resumed_mask is not None and resumed_mask < vocab_size:
        if announce:
            get_logger().info(
                "drafter.mask_token_id = -1 (auto): resuming with the checkpoint's id %d",
                resumed_mask,
            )
        return msgspec.structs.replace(drafter, mask_token_id=resumed_mask)
    try:
        tokenizer = load_tokenizer(target_path)
    except DatasetError:
        tokenizer = None
    choice = choose_mask_token(tokenizer, vocab_size)
    if announce:
        level = logging.WARNING if choice.ordinary else logging.INFO
        get_logger().log(level, "%s", choice.describe())
    return msgspec.structs.replace(drafter, mask_token_id=choice.token_id)


def _target_and_taps(config: Config, target_path: Path, info: RankInfo) -> tuple[Any, list[int]]:
    """The target's config and its tapped layers, checked; with target groups, also that
    the layers a group keeps (up to the deepest tap) can be split over target_tp members,
    before anything is loaded. A target rank of a hybrid target chooses its Gated DeltaNet
    kernels first (`choose_linear_attention`): the structure check imports the model's
    code, and with it FLA, which reads its kernel configurations only when imported."""
    target_config = read_target_config(
        target_path, weights=not config.target.random_weights, structure=False
    )
    if info.is_target:
        choose_linear_attention(target_config, info.device, config.target.linear_attention)
    # The built-in target's structure is known: its ranks (drafters too) need not import
    # the model's code for the check.
    if config.target.path:
        check_structure(target_config)
    num_layers = target_config.num_hidden_layers
    try:
        taps = config.target.tap_layers or default_tap_layers(num_layers, config.target.num_taps)
        taps = check_tap_layers(taps, num_layers, f"target.tap_layers ({target_path})")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    try:
        if config.layout.target_tp > 1:
            kept = TargetModelDir(target_path, weights=False).text_config(max(taps) + 1)
            check_target_group(kept, config.layout.target_tp)
    except TargetLoadError as exc:
        raise ConfigError(f"[layout] target_tp = {config.layout.target_tp}: {exc}") from None
    return target_config, taps


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
    """Held-out batches of one evaluation round over every producer (0: no evaluation)."""
    if not config.run.eval_every or plan.eval_dataset is None:
        return 0
    producers = info.producer_count
    return batch_stream(config, plan.eval_dataset, 0, producers).batches_per_rank * producers


def ring_spec(config: Config, info: RankInfo, run_dir: Path, plan: Plan) -> RingSpec:
    """The spec of this node's ring, identical on every local rank."""
    roles = [local_role(i, info.targets_per_node) for i in range(info.local_world_size)]
    first = info.node_rank * info.local_world_size
    return RingSpec(
        run_id=ring_id(config.run.name, str(run_dir), info.node_rank),
        generation=info.restart_count,
        ends=[END_OF_ROLE[role] for role in roles],
        global_ranks=[first + i for i in range(info.local_world_size)],
        slots_per_producer=config.ring.slots_per_producer,
        max_tokens=config.data.token_budget,
        max_docs=plan.max_docs,
        fields=slot_fields(
            len(plan.tap_layers), plan.spec.hidden_size, dtype_name(plan.hidden_dtype)
        ),
        transport=config.ring.transport,
        wait_timeout_s=config.ring.wait_timeout_s,
        heartbeat_timeout_s=config.ring.heartbeat_timeout_s,
        progress_timeout_s=config.ring.progress_timeout_s,
        startup_timeout_s=config.ring.startup_timeout_s,
        lock_dir=config.ring.lock_dir,
        group_size=info.target_tp,
        labels=roles,
    )
