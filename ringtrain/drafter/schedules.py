"""The learning-rate schedules ([optim] schedule): multipliers of optim.lr by step.

Both start with a linear warm-up over `warmup_fraction` of the steps and end at
`min_lr_ratio` of the peak; by their config name (`SCHEDULES`):

- ``cosine``: after the warm-up, a cosine from the peak down to min_lr_ratio.
- ``wsd`` (warmup-stable-decay): after the warm-up the peak holds; the last
  `decay_fraction` of the steps decay it with a 1 - sqrt shape (drops quickly at first,
  then flattens towards min_lr_ratio). In published cool-down comparisons 1 - sqrt
  matched or beat a linear decay of the same length, and a stable phase lets a run be
  stretched (a longer run.max_steps on resume) without redoing a decay already begun.

A schedule holds plain numbers only, so LambdaLR's state_dict stays a plain dict (a
checkpoint records them, see `saved_schedule_fields`). A new schedule is a class with these
members and an entry in `SCHEDULES` (and its name among the config's choices,
drafter/config.py: ringtrain/choices.py checks both).
"""

from __future__ import annotations

import math
from typing import Any

from ringtrain.choices import choice_table
from ringtrain.drafter.config import OptimConfig


class WarmupCosine:
    """LR multiplier: linear warm-up over warmup_fraction of the steps, then cosine to
    min_lr_ratio."""

    def __init__(self, total_steps: int, warmup_fraction: float, min_lr_ratio: float) -> None:
        self.schedule = "cosine"
        self.total_steps = total_steps
        self.warmup_steps = max(1, round(warmup_fraction * total_steps))
        self.min_lr_ratio = min_lr_ratio

    @classmethod
    def from_config(cls, cfg: OptimConfig, total_steps: int) -> WarmupCosine:
        """The schedule cfg describes, over `total_steps` steps."""
        return cls(total_steps, cfg.warmup_fraction, cfg.min_lr_ratio)

    @staticmethod
    def problem(cfg: OptimConfig) -> str | None:
        """Why cfg's fractions leave no steps for the decay (None: they leave some)."""
        if cfg.warmup_fraction < 1.0:
            return None
        return (
            f"optim.warmup_fraction = {cfg.warmup_fraction:g} leaves the cosine schedule no "
            "steps to decay (the run would end at the peak lr, not at optim.min_lr_ratio); "
            "use a warm-up fraction below 1 (default 0.04)"
        )

    def __call__(self, step: int) -> float:
        """The learning-rate multiplier at `step` (0-based)."""
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        decay_steps = max(1, self.total_steps - self.warmup_steps)
        progress = min(1.0, (step - self.warmup_steps) / decay_steps)
        cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * cosine

    def describe(self) -> str:
        """The shape in words, for the log."""
        return (
            f"warm-up {self.warmup_steps} steps, then cosine to {self.min_lr_ratio:g} of optim.lr"
        )


class WarmupStableDecay:
    """LR multiplier: linear warm-up, the peak held, then a 1 - sqrt decay to min_lr_ratio
    over the last decay_fraction of the steps (never before the warm-up ends)."""

    def __init__(
        self, total_steps: int, warmup_fraction: float, min_lr_ratio: float, decay_fraction: float
    ) -> None:
        self.schedule = "wsd"
        self.total_steps = total_steps
        self.warmup_steps = max(1, round(warmup_fraction * total_steps))
        self.min_lr_ratio = min_lr_ratio
        self.decay_fraction = decay_fraction
        decay_steps = round(decay_fraction * total_steps)
        self.decay_start = max(self.warmup_steps, total_steps - decay_steps)

    @classmethod
    def from_config(cls, cfg: OptimConfig, total_steps: int) -> WarmupStableDecay:
        """The schedule cfg describes, over `total_steps` steps."""
        return cls(total_steps, cfg.warmup_fraction, cfg.min_lr_ratio, cfg.decay_fraction)

    @staticmethod
    def problem(cfg: OptimConfig) -> str | None:
        """Why cfg's fractions leave no room for the decay (None: they leave some)."""
        if cfg.warmup_fraction + cfg.decay_fraction <= 1.0:
            return None
        return (
            f"optim.warmup_fraction = {cfg.warmup_fraction:g} + optim.decay_fraction = "
            f"{cfg.decay_fraction:g} exceed 1: the wsd decay starts only when the warm-up "
            "ends, so it would get fewer steps than asked (none at a warm-up fraction of 1: "
            "the run would end at the peak lr); make the two sum to at most 1"
        )

    def __call__(self, step: int) -> float:
        """The learning-rate multiplier at `step` (0-based)."""
        if step < self.decay_start:  # the warm-up reaches 1 at its last step, then holds
            return min(1.0, (step + 1) / self.warmup_steps)
        decay_steps = max(1, self.total_steps - self.decay_start)
        progress = min(1.0, (step - self.decay_start) / decay_steps)
        return self.min_lr_ratio + (1.0 - self.min_lr_ratio) * (1.0 - math.sqrt(progress))

    def describe(self) -> str:
        """The shape in words, for the log."""
        return (
            f"warm-up {self.warmup_steps} steps, optim.lr until step {self.decay_start}, then "
            f"1 - sqrt decay to {self.min_lr_ratio:g} of it"
        )


Schedule = WarmupCosine | WarmupStableDecay
SCHEDULES: dict[str, type[Schedule]] = choice_table(
    OptimConfig, "schedule", {"cosine": WarmupCosine, "wsd": WarmupStableDecay}
)


def schedule_problem(cfg: OptimConfig) -> str | None:
    """Why cfg's warm-up and decay fractions leave its schedule no room to decay to
    min_lr_ratio (None when they leave some): checked when the config is loaded."""
    return SCHEDULES[cfg.schedule].problem(cfg)


def schedule_of(cfg: OptimConfig, total_steps: int) -> Schedule:
    """The schedule `cfg.schedule` names, over `total_steps` steps."""
    return SCHEDULES[cfg.schedule].from_config(cfg, total_steps)


def saved_schedule_fields(saved_schedule: dict[str, Any]) -> dict[str, Any]:
    """The schedule's fields a LambdaLR state dict holds (empty when it holds none); a
    schedule without a `schedule` field is a cosine (the only one before the choice)."""
    lambdas = saved_schedule.get("lr_lambdas") or [None]
    fields = lambdas[0] or {}
    return {"schedule": "cosine", **fields} if fields else {}
