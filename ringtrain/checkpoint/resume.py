"""A drafter's training saved into a checkpoint, and resumed from one.

`save_training` writes the checkpoint of a resume record's step and then applies
run.keep_checkpoints (retention.py). `resume_training` loads a checkpoint into a freshly
built drafter and its optimiser: the weights, the optimiser's moments and the RNG states
as saved; the optimiser's settings and the schedule (over the configured steps, from the
saved step) as the config says now, each change logged. It returns where training
continues: the step, each producer's data cursor and the last completed held-out round.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ringtrain.checkpoint.load import load_checkpoint
from ringtrain.checkpoint.resume_record import ResumeRecord, StreamCursor
from ringtrain.checkpoint.retention import prune_checkpoints
from ringtrain.checkpoint.save import save_checkpoint
from ringtrain.drafter.config import OptimConfig
from ringtrain.drafter.optim import resume_settings, saved_schedule_length, schedule_at
from ringtrain.drafter.spec import DrafterSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ResumePoint:
    """Where a resumed drafter continues."""

    step: int  # the checkpoint's step: the last one trained
    cursors: dict[int, StreamCursor]  # by producer: where its batch stream resumes
    evaluated_step: int  # the step the last completed held-out round was due after


def save_training(
    root: Path,
    record: ResumeRecord,
    model: nn.Module,
    spec: DrafterSpec,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    keep: int,
) -> Path:
    """Checkpoint the training at `record.step` under `root` with its resume `record`, then
    delete all but the newest `keep` checkpoints (run.keep_checkpoints; 0 keeps all).
    Returns the checkpoint's path."""
    path = save_checkpoint(root, record.step, model, spec, optimizer, scheduler, record)
    log.info("checkpoint written: %s", path)
    prune_checkpoints(root, keep, path)
    return path


def resume_training(
    path: Path,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    cfg: OptimConfig,
    total_steps: int,
    device: torch.device,
) -> tuple[ResumePoint, torch.optim.lr_scheduler.LambdaLR]:
    """Load checkpoint `path` into `model` and `optimizer` (see the module docstring);
    returns where training resumes and the schedule over `total_steps` from there."""
    log.info("loading checkpoint %s", path)
    checkpoint = load_checkpoint(path, device)
    model.load_state_dict(checkpoint.model.state_dict())
    checkpoint.restore(optimizer)
    changes = resume_settings(optimizer, cfg, checkpoint.saved_schedule)
    saved_total, _ = saved_schedule_length(checkpoint.saved_schedule)
    if saved_total is not None and saved_total != total_steps:
        changes.append(f"run.max_steps {saved_total} -> {total_steps}")
    scheduler = schedule_at(optimizer, cfg, total_steps, checkpoint.step)
    log.info(
        "resumed from %s at step %d; schedule: step %d of %d, lr %.4g (optim.lr %g; %s)",
        path, checkpoint.step, checkpoint.step, total_steps, scheduler.get_last_lr()[0],
        cfg.lr, scheduler.lr_lambdas[0].describe(),
    )  # fmt: skip
    for change in changes:
        log.info("resume applies the config's setting: %s", change)
    record = checkpoint.record
    return ResumePoint(checkpoint.step, record.cursors, record.evaluated_step), scheduler
