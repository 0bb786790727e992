"""The optimisers ([optim] name) with their schedule, the optimiser step, and resuming both.

By config name (`OPTIMIZERS`):

- ``adamw``: AdamW on every trainable parameter, weight decay on matrices only.
- ``muon``: Muon on the decoder layers' weight matrices (`hidden_matrices`), AdamW (as
  above) on the rest, in one optimiser (drafter/muon.py; Muon stepped a matrix shape at
  a time). Muon's lr is adjusted per matrix by torch's "match_rms_adamw" rule, so
  optim.lr and optim.weight_decay mean for it what they mean for AdamW (see OptimConfig).

Every param group names the algorithm that steps it (`ALGORITHM_KEY`), so an optimiser
state dict says which optimiser wrote it (`saved_optimizer_name`). Parameters stay fp32
(master weights); compute runs under bf16 autocast on GPU. The fused AdamW kernel is used
on CUDA and the foreach one elsewhere. The step clips the gradients and skips the update
when their norm is not finite. An optimiser that takes the clip's divisor and the skip
flag as tensors (`clips_in_step`: the fused AdamW, and Muon with a fused AdamW beside it)
does both inside its step, so the step is queued without the host waiting for the GPU
and the norm is read whenever its reader wants it; the others read the norm first (one
host sync per step, before the update).

On resume the optimiser's state (moments, momenta) comes from the checkpoint, but its
settings and the schedule follow the config: `resume_settings` applies lr, betas, eps,
weight decay and Muon's momentum and says what changed, `schedule_at` rebuilds the
schedule (drafter/schedules.py) over the configured number of steps, continuing from the
saved step (a longer run.max_steps stretches it). Another optimiser than the
checkpoint's is refused before that (trainer/plan.py): its state cannot continue.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from ringtrain.choices import choice_table
from ringtrain.drafter.config import OptimConfig
from ringtrain.drafter.muon import BatchedMuon, MuonAdamW
from ringtrain.drafter.schedules import saved_schedule_fields, schedule_of

# The param-group key naming the algorithm that steps the group; groups saved before it
# existed are AdamW's (the only optimiser then).
ALGORITHM_KEY = "algorithm"


def _adamw_settings(cfg: OptimConfig) -> list[dict[str, Any]]:
    """AdamW's group settings: matrices (with weight decay), then everything else."""
    common = {"betas": (cfg.beta1, cfg.beta2), "eps": cfg.eps, ALGORITHM_KEY: "adamw"}
    return [{**common, "weight_decay": cfg.weight_decay}, {**common, "weight_decay": 0.0}]


def _adamw(cfg: OptimConfig, params: list[nn.Parameter]) -> torch.optim.AdamW:
    """AdamW over `params`: weight decay on the matrices, none on vectors (norm weights)."""
    on_cuda = bool(params) and params[0].is_cuda
    matrices = [p for p in params if p.ndim >= 2]
    vectors = [p for p in params if p.ndim < 2]
    groups = zip((matrices, vectors), _adamw_settings(cfg), strict=True)
    return torch.optim.AdamW(
        [{"params": group_params, **settings} for group_params, settings in groups],
        lr=cfg.lr,
        fused=on_cuda,
        foreach=None if on_cuda else True,
    )


def hidden_matrices(model: nn.Module) -> list[nn.Parameter]:
    """The trainable weight matrices of the model's decoder layers (`layers.*`): what Muon
    steps. The input projection, norms and biases are left out (AdamW's)."""
    return [
        param
        for name, param in model.named_parameters()
        if param.requires_grad and param.ndim == 2 and name.startswith("layers.")
    ]


class AdamWOnAll:
    """``adamw``: AdamW on every trainable parameter."""

    @staticmethod
    def group_settings(cfg: OptimConfig) -> list[dict[str, Any]]:
        """Each param group's settings, in group order."""
        return _adamw_settings(cfg)

    @staticmethod
    def build(model: nn.Module, cfg: OptimConfig) -> torch.optim.Optimizer:
        """The optimiser over `model`'s trainable parameters."""
        return _adamw(cfg, [p for p in model.parameters() if p.requires_grad])


class MuonOnHidden:
    """``muon``: Muon on the decoder layers' matrices, AdamW on the rest."""

    @staticmethod
    def group_settings(cfg: OptimConfig) -> list[dict[str, Any]]:
        """Each param group's settings, in group order: Muon's, then AdamW's."""
        muon = {"momentum": cfg.muon_momentum, "weight_decay": cfg.weight_decay}
        return [{**muon, ALGORITHM_KEY: "muon"}, *_adamw_settings(cfg)]

    @staticmethod
    def build(model: nn.Module, cfg: OptimConfig) -> torch.optim.Optimizer:
        """The optimiser over `model`'s trainable parameters."""
        hidden = hidden_matrices(model)
        if not hidden:
            raise ValueError(
                f"optim.name = 'muon' found no decoder-layer weight matrices (layers.*) in "
                f"the {type(model).__name__} to apply Muon to; use optim.name = 'adamw'"
            )
        muon_ids = {id(p) for p in hidden}
        rest = [p for p in model.parameters() if p.requires_grad and id(p) not in muon_ids]
        muon = BatchedMuon(
            [{"params": hidden, **MuonOnHidden.group_settings(cfg)[0]}],
            lr=cfg.lr,
            adjust_lr_fn="match_rms_adamw",
        )
        return MuonAdamW(muon, _adamw(cfg, rest))


OPTIMIZERS: dict[str, type[AdamWOnAll | MuonOnHidden]] = choice_table(
    OptimConfig, "name", {"adamw": AdamWOnAll, "muon": MuonOnHidden}
)


def build_optimizer(
    model: nn.Module, cfg: OptimConfig, total_steps: int
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """The optimiser cfg.name names over the trainable parameters, and cfg's schedule."""
    optimizer = OPTIMIZERS[cfg.name].build(model, cfg)
    return optimizer, schedule_at(optimizer, cfg, total_steps, 0)


def saved_optimizer_name(optimizer_state: dict[str, Any]) -> str:
    """The optim.name whose optimiser wrote `optimizer_state` (a state_dict)."""
    algorithms = {group.get(ALGORITHM_KEY, "adamw") for group in optimizer_state["param_groups"]}
    return "muon" if "muon" in algorithms else "adamw"


def schedule_at(
    optimizer: torch.optim.Optimizer, cfg: OptimConfig, total_steps: int, step: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """cfg's schedule over `total_steps` from cfg.lr, positioned after `step` completed
    steps (every group's lr set to the one of step `step` + 1)."""
    if total_steps < 1:
        raise ValueError(f"total_steps={total_steps}: the schedule needs at least one step")
    for group in optimizer.param_groups:
        group["initial_lr"] = cfg.lr
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, schedule_of(cfg, total_steps), last_epoch=step - 1
    )


def _group_values(groups: list[dict[str, Any]]) -> dict[str, Any]:
    """The [optim] settings as the param groups hold them, by config key (each from the
    first group holding it; the first group always has weight decay)."""
    first = groups[0]
    values = {"optim.lr": first.get("initial_lr", first["lr"])}
    for group in groups:
        if group.get(ALGORITHM_KEY, "adamw") == "muon":
            values.setdefault("optim.muon_momentum", group["momentum"])
        else:
            values.setdefault("optim.beta1", group["betas"][0])
            values.setdefault("optim.beta2", group["betas"][1])
            values.setdefault("optim.eps", group["eps"])
    values["optim.weight_decay"] = first["weight_decay"]
    return values


def _schedule_values(fields: dict[str, Any], cfg: OptimConfig) -> dict[str, Any]:
    """The schedule settings in saved schedule `fields`, by config key (cfg's where the
    fields do not hold one)."""
    return {
        "optim.schedule": fields.get("schedule", cfg.schedule),
        "optim.min_lr_ratio": fields.get("min_lr_ratio", cfg.min_lr_ratio),
        "optim.decay_fraction": fields.get("decay_fraction", cfg.decay_fraction),
    }


def resume_settings(
    optimizer: torch.optim.Optimizer, cfg: OptimConfig, saved_schedule: dict[str, Any]
) -> list[str]:
    """Apply cfg's settings to an optimizer whose state was just loaded from a checkpoint
    of the same optimiser (saved under the schedule `saved_schedule`, a LambdaLR state
    dict); returns one "key saved -> now" line per setting the config changed."""
    saved = {
        **_group_values(optimizer.param_groups),
        **_schedule_values(saved_schedule_fields(saved_schedule), cfg),
    }
    settings = OPTIMIZERS[cfg.name].group_settings(cfg)
    for group, group_settings in zip(optimizer.param_groups, settings, strict=True):
        group.update(group_settings, initial_lr=cfg.lr)
    now = {**_group_values(optimizer.param_groups), **_schedule_values({}, cfg)}
    return [f"{key} {saved[key]} -> {now[key]}" for key in now if saved[key] != now[key]]


def saved_schedule_length(saved_schedule: dict[str, Any]) -> tuple[int | None, int | None]:
    """(total steps, warm-up steps) of the schedule a checkpoint was written under."""
    fields = saved_schedule_fields(saved_schedule)
    return fields.get("total_steps"), fields.get("warmup_steps")


def is_fused_adamw(optimizer: torch.optim.Optimizer) -> bool:
    """Whether `optimizer` is AdamW running its fused kernel (the CUDA choice here)."""
    return isinstance(optimizer, torch.optim.AdamW) and bool(optimizer.defaults.get("fused"))


def clips_in_step(optimizer: torch.optim.Optimizer) -> bool:
    """Whether `optimizer` divides the gradients by a ``grad_scale`` tensor and leaves
    everything alone where a ``found_inf`` tensor is 1 inside its step (the hooks torch's
    mixed-precision scaler uses): the fused AdamW, BatchedMuon, and MuonAdamW when both
    its parts do."""
    if isinstance(optimizer, MuonAdamW):
        return all(clips_in_step(part) for part in optimizer.parts)
    return isinstance(optimizer, BatchedMuon) or is_fused_adamw(optimizer)


def _clipped_in_step(
    optimizer: torch.optim.Optimizer, params: list[nn.Parameter], max_norm: float
) -> torch.Tensor:
    """Clip and step inside the optimiser's step (`clips_in_step`); returns the gradient
    norm, still on the device.

    The clip needs no pass of its own over the gradients, and the non-finite decision no
    host sync before the step is queued."""
    norm = torch.nn.utils.get_total_norm([p.grad for p in params], foreach=True).float()
    # clip_grad_norm_'s coefficient max_norm / (norm + 1e-6), at most 1, as a divisor.
    optimizer.grad_scale = ((norm + 1e-6) / max_norm).clamp(min=1.0)
    optimizer.found_inf = (~norm.isfinite()).float()
    try:
        optimizer.step()
    finally:
        del optimizer.grad_scale, optimizer.found_inf
    return norm


def optimizer_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    cfg: OptimConfig,
    *,
    grads_to_none: bool = False,
    clip_in_step: bool = False,
) -> torch.Tensor:
    """Clip gradients to cfg.grad_clip, step unless their norm is not finite, advance the
    schedule, clear grads; returns the norm as a 0-d tensor (not finite: the weights were
    left alone). Reading it (``float(norm)``) waits for the step.

    ``clip_in_step``: an optimiser that can (`clips_in_step`) clips and skips inside its
    step (`_clipped_in_step`), so nothing here waits for the GPU; other optimisers clip,
    read the norm, then step.
    ``grads_to_none``: free the gradients instead of zeroing them, so the next backward
    writes them rather than adding them to zeros (no memset, no add per parameter). Only
    for a model trained alone: under DDP the .grad tensors are views into its buckets.

    Under DDP every rank holds the same reduced gradients, so every rank computes the same
    norm and takes the same decision."""
    params = [p for p in model.parameters() if p.grad is not None]
    max_norm = cfg.grad_clip if cfg.grad_clip > 0 else math.inf
    if clip_in_step and params and clips_in_step(optimizer):
        norm = _clipped_in_step(optimizer, params, max_norm)
    else:
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
        if math.isfinite(norm):
            optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=grads_to_none)
    return norm
