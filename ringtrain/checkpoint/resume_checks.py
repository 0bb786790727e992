"""The checks before a resume: the newest checkpoint must fit this run, or it is refused.

A resume must train the batch sequence the checkpoint was trained on, or each target's
cursor would point into another sequence (batches trained twice or never): every
checkpoint's resume record holds what decides it (`stream_identity`, a StreamIdentity)
and `--resume` refuses any change, naming the setting and both values. A moved dataset
with the same rows is accepted. The drafter's shape (its spec) and the optimiser must be
the checkpoint's too. Each refusal is a ConfigError naming the checkpoint and the fix.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import numpy as np

from ringtrain.checkpoint.load import saved_optimizer_state
from ringtrain.checkpoint.resume_record import StreamIdentity, read_resume_record, recorded_settings
from ringtrain.checkpoint.verify import checkpoint_spec
from ringtrain.config import Config, ConfigError
from ringtrain.data import TokenDataset
from ringtrain.drafter.config import OptimConfig
from ringtrain.drafter.optim import saved_optimizer_name
from ringtrain.drafter.spec import DrafterSpec

log = logging.getLogger(__name__)


def check_resume(
    checkpoint: Path, spec: DrafterSpec, stream: StreamIdentity, optim: OptimConfig, announce: bool
) -> None:
    """Raise ConfigError unless `checkpoint` was trained for this drafter shape, batch
    sequence and optimiser (see the module docstring); `announce`: this rank logs what is
    accepted with a note (one rank says it)."""
    check_resume_spec(checkpoint, spec)
    check_resume_stream(checkpoint, stream, announce)
    check_resume_optimizer(checkpoint, optim)


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


def check_resume_optimizer(checkpoint: Path, cfg: OptimConfig) -> None:
    """Raise ConfigError if `checkpoint` was trained with another optimiser than cfg.name
    (its state, moments or momenta, cannot continue under another one)."""
    saved = saved_optimizer_name(saved_optimizer_state(checkpoint))
    if saved != cfg.name:
        raise ConfigError(
            f"--resume: optim.name is {cfg.name!r} but checkpoint {checkpoint} was trained "
            f"with {saved!r}; its optimiser state does not carry over to another optimiser: "
            f"resume with optim.name = {saved!r}, or start a new run (--overwrite, or another "
            "run.run_dir)"
        )


def stream_identity(config: Config, dataset: TokenDataset, targets: int) -> StreamIdentity:
    """Everything that decides the targets' batch sequence: the dataset (path, kept rows,
    tokens and a hash of the row lengths, cheap to compute and sensitive to any change of
    the rows), the [data] settings, the target count and the target group size (together:
    the producer count, which shards the data)."""
    return StreamIdentity(
        data_seed=config.data.seed,
        token_budget=config.data.token_budget,
        bucket=config.data.bucket,
        max_len=config.data.max_len,
        truncate=config.data.truncate,
        targets=targets,
        target_tp=config.layout.target_tp,
        data_path=str(dataset.path),
        dataset_rows=dataset.num_rows,
        dataset_tokens=dataset.num_tokens,
        row_lengths_hash=hashlib.blake2b(
            np.ascontiguousarray(dataset.row_length, dtype=np.int64).tobytes(), digest_size=8
        ).hexdigest(),
    )


def check_resume_stream(checkpoint: Path, stream: StreamIdentity, announce: bool) -> None:
    """Raise ConfigError if the checkpoint was trained on another batch sequence than
    `stream` describes; a checkpoint that does not record its sequence gets a warning
    (logged where `announce`: one rank says it)."""
    saved = read_resume_record(checkpoint).stream
    if saved is None:
        if announce:
            log.warning(
                "--resume: checkpoint %s does not record its batch sequence (written by an "
                "older version): it cannot be checked that the data settings are unchanged",
                checkpoint,
            )
        return
    for field, setting in recorded_settings().items():
        was, now = getattr(saved, field), getattr(stream, field)
        if field == "data_path" or was == now:
            continue
        raise ConfigError(
            f"--resume: {setting} is {now!r} but checkpoint {checkpoint} was trained with "
            f"{was!r}; the batch sequence would change (batches trained twice or "
            f"never): resume with the original value, or start a new run (--overwrite, or "
            "another run.run_dir)"
        )
    if saved.data_path != stream.data_path and announce:
        log.info(
            "--resume: the dataset moved from %s to %s (same rows)",
            saved.data_path,
            stream.data_path,
        )
