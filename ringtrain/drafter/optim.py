"""AdamW with linear warm-up and cosine decay, and a host-sync-free optimiser step.

Parameters stay fp32 (master weights); compute runs under bf16 autocast on GPU. Weight
decay applies to matrices only, never to norm weights. The fused AdamW kernel is used on
CUDA and the foreach one elsewhere; gradient clipping returns the norm as a tensor.
"""

from __future__ import annotations

import math

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
    if total_steps < 1:
        raise ValueError(f"total_steps={total_steps}: the schedule needs at least one step")
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
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, WarmupCosine(total_steps, cfg.warmup_fraction, cfg.min_lr_ratio)
    )
    return optimizer, scheduler


def optimizer_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    cfg: OptimConfig,
) -> torch.Tensor:
    """Clip gradients to cfg.grad_clip, step, advance the schedule, zero grads; returns the norm."""
    params = [p for p in model.parameters() if p.grad is not None]
    max_norm = cfg.grad_clip if cfg.grad_clip > 0 else math.inf
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
    optimizer.step()
    scheduler.step()
    # In place, not set_to_none: under DDP the .grad tensors are views into its buckets.
    optimizer.zero_grad(set_to_none=False)
    return norm
