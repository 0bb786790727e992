"""AdamW with linear warm-up and cosine decay, the optimiser step, and resuming both.

Parameters stay fp32 (master weights); compute runs under bf16 autocast on GPU. Weight
decay applies to matrices only, never to norm weights. The fused AdamW kernel is used on
CUDA and the foreach one elsewhere. The step clips the gradients and skips the update
when their norm is not finite (one host sync per step for that decision).

On resume the optimiser's moments come from the checkpoint, but its settings and the
schedule follow the config: `resume_settings` applies lr, betas, eps and weight decay and
says what changed, `schedule_at` rebuilds the schedule over the configured number of
steps, continuing from the saved step (a longer run.max_steps stretches the cosine).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from ringtrain.drafter.config import OptimConfig


class WarmupCosine:
    """LR multiplier: linear warm-up over warmup_fraction of the steps, then cosine to min_lr_ratio.

    Holds plain numbers only, so LambdaLR's state_dict stays a plain dict.
    """

    def __init__(self, total_steps: int, warmup_fraction: float, min_lr_ratio: float) -> None:
        self.total_steps = total_steps
        self.warmup_steps = max(1, round(warmup_fraction * total_steps))
        self.min_lr_ratio = min_lr_ratio

    def __call__(self, step: int) -> float:
        """The learning-rate multiplier at `step` (0-based)."""
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        decay_steps = max(1, self.total_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / decay_steps)
        cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * cosine


def build_optimizer(
    model: nn.Module, cfg: OptimConfig, total_steps: int
) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over the trainable parameters and its warm-up + cosine LambdaLR."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    on_cuda = bool(params) and params[0].is_cuda
    optimizer = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": cfg.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        eps=cfg.eps,
        fused=on_cuda,
        foreach=None if on_cuda else True,
    )
    return optimizer, schedule_at(optimizer, cfg, total_steps, 0)


def schedule_at(
    optimizer: torch.optim.Optimizer, cfg: OptimConfig, total_steps: int, step: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """The warm-up + cosine schedule over `total_steps` from cfg.lr, positioned after `step`
    completed steps (every group's lr set to the one of step `step` + 1)."""
    if total_steps < 1:
        raise ValueError(f"total_steps={total_steps}: the schedule needs at least one step")
    for group in optimizer.param_groups:
        group["initial_lr"] = cfg.lr
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        WarmupCosine(total_steps, cfg.warmup_fraction, cfg.min_lr_ratio),
        last_epoch=step - 1,
    )


def resume_settings(
    optimizer: torch.optim.Optimizer, cfg: OptimConfig, saved_schedule: dict[str, Any]
) -> list[str]:
    """Apply cfg's settings to an optimizer whose state was just loaded from a checkpoint
    (saved under the schedule `saved_schedule`, a LambdaLR state dict); returns one
    "key saved -> now" line per setting the config changed."""
    decay_group = optimizer.param_groups[0]
    saved = {
        "optim.lr": decay_group.get("initial_lr", decay_group["lr"]),
        "optim.beta1": decay_group["betas"][0],
        "optim.beta2": decay_group["betas"][1],
        "optim.eps": decay_group["eps"],
        "optim.weight_decay": decay_group["weight_decay"],
        "optim.min_lr_ratio": _saved_lambda(saved_schedule).get("min_lr_ratio", cfg.min_lr_ratio),
    }
    now = {
        "optim.lr": cfg.lr,
        "optim.beta1": cfg.beta1,
        "optim.beta2": cfg.beta2,
        "optim.eps": cfg.eps,
        "optim.weight_decay": cfg.weight_decay,
        "optim.min_lr_ratio": cfg.min_lr_ratio,
    }
    for group, weight_decay in zip(optimizer.param_groups, (cfg.weight_decay, 0.0), strict=True):
        group.update(betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, weight_decay=weight_decay)
    return [f"{key} {saved[key]} -> {now[key]}" for key in now if saved[key] != now[key]]


def _saved_lambda(saved_schedule: dict[str, Any]) -> dict[str, Any]:
    """The WarmupCosine fields a LambdaLR state dict holds (empty when it holds none)."""
    lambdas = saved_schedule.get("lr_lambdas") or [None]
    return lambdas[0] or {}


def saved_schedule_length(saved_schedule: dict[str, Any]) -> tuple[int | None, int | None]:
    """(total steps, warm-up steps) of the schedule a checkpoint was written under."""
    fields = _saved_lambda(saved_schedule)
    return fields.get("total_steps"), fields.get("warmup_steps")


def optimizer_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    cfg: OptimConfig,
) -> float:
    """Clip gradients to cfg.grad_clip, step unless their norm is not finite, advance the
    schedule, zero grads; returns the norm (not finite: the weights were left alone).

    Under DDP every rank holds the same reduced gradients, so every rank computes the same
    norm and takes the same decision."""
    params = [p for p in model.parameters() if p.grad is not None]
    max_norm = cfg.grad_clip if cfg.grad_clip > 0 else math.inf
    norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True))
    if math.isfinite(norm):
        optimizer.step()
    scheduler.step()
    # In place, not set_to_none: under DDP the .grad tensors are views into its buckets.
    optimizer.zero_grad(set_to_none=False)
    return norm
