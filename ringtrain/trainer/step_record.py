"""A drafter step's record, and how a step concludes once its update is queued.

The optimizer step is queued without the host reading its gradient norm
(trainer/drafter_loop.py), so a step concludes a step later: its norm is read after the
next step's forward and reduction (which waits for the GPU anyway), which says whether its
update was skipped for a non-finite loss or norm, and its record reaches the reporter once
that next step's backward is queued; before a checkpoint and at the end, at once.
optim.max_nonfinite_steps skipped steps in a row stop the run where the last of them
concludes, before the next update; a session whose every step was skipped fails before its
final checkpoint.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

import torch

from ringtrain.trainer.logs import get_logger


@dataclass
class StepRecord:
    """What one completed global step did, as the lead drafter reports it."""

    step: int
    loss: float
    accuracy: list[float]
    tau_uniform: float  # uniform-anchor acceptance of the training batches (not tau_sim)
    tokens: int
    seconds: float
    lr: float
    batches: list[list[int]]
    wall: float  # time.time() at the end of the step
    compiles: int  # graphs compiled so far in this process (flat in steady state)
    gpu_busy: float | None  # this rank's GPU busy fraction since the last step (NVML)
    gpu_busy_by_rank: dict[int, float]  # last fraction published by each rank of the node
    # DDP's sampled timing of this step's gradient reduction (None on unsampled steps and
    # for a drafter alone): its duration, and the part backward did not hide.
    grad_sync_ms: float | None = None
    grad_sync_exposed_ms: float | None = None
    # Norm of the reduced gradients before clipping (None: the loss was not finite, so
    # no backward ran), and whether the update was skipped for a non-finite value.
    grad_norm: float | None = None
    skipped: bool = False
    # The named parts of loss the drafter's sums report (DFlash2: selector_loss).
    loss_parts: dict[str, float] = field(default_factory=dict)

    def as_json(self) -> dict[str, object]:
        """The record as a metrics.jsonl line holds it: each loss part beside loss."""
        line: dict[str, object] = {}
        for name, value in vars(self).items():
            if name != "loss_parts":
                line[name] = value
            if name == "loss":
                line.update(self.loss_parts)
        return line


@dataclass
class UnreadStep:
    """A step whose optimizer step is queued: its record, and its gradient norm on the
    device (None: the loss was not finite, no backward ran), read when the step concludes."""

    record: StepRecord
    grad_norm: torch.Tensor | None


class Reporter(Protocol):
    """Where the lead drafter's steps and evaluation rounds go (trainer/progress.py)."""

    def step(self, record: StepRecord) -> None: ...

    def evaluation(self, step: int, metrics: dict) -> None: ...


class StepConclusions:
    """One training session's steps concluded in order (see the module docstring): the
    skipped ones counted, each record handed to `reporter` (None: kept nowhere)."""

    def __init__(
        self, reporter: Reporter | None, first_step: int, log_every: int, max_nonfinite: int
    ) -> None:
        self.reporter = reporter
        self.first_step = first_step
        self.log_every = log_every
        self.max_nonfinite = max_nonfinite
        self.nonfinite_in_a_row = 0  # skipped steps since the last applied update
        self.applied = 0  # steps of this session whose update reached the weights

    def conclude(self, unread: UnreadStep | None) -> StepRecord | None:
        """Read a step's gradient norm (waiting for its optimizer step if it still runs) and
        mark its record skipped or not; returns the record, to be reported. Too many
        skipped steps in a row stop the run here, the record reported first."""
        if unread is None:
            return None
        record = unread.record
        self._mark_skipped(record, None if unread.grad_norm is None else float(unread.grad_norm))
        if self.nonfinite_in_a_row >= self.max_nonfinite:
            self.report(record)
            raise FloatingPointError(
                f"{self.nonfinite_in_a_row} steps in a row (up to step {record.step}) had a "
                f"non-finite loss or gradient norm (optim.max_nonfinite_steps = "
                f"{self.max_nonfinite}); the weights hold the last finite update: lower "
                "optim.lr or check the data, then resume from the newest checkpoint"
            )
        return record

    def report(self, record: StepRecord | None) -> None:
        """Hand a concluded step's record to the reporter (and say when the first is done)."""
        if record is None:
            return
        if self.reporter is not None:
            self.reporter.step(record)
        if record.step == self.first_step:
            get_logger().info(
                "first step done in %.1f s; a progress line every %d steps",
                record.seconds,
                self.log_every,
            )

    def fail_if_nothing_trained(self, steps: int) -> None:
        """A session whose every step was skipped trained nothing: it fails, named, before
        its final checkpoint (which would hold the weights it started from)."""
        if steps > 0 and self.applied == 0:
            raise FloatingPointError(
                f"all {steps} steps of this session were skipped for a non-finite loss or "
                "gradient norm: the drafter trained nothing and no final checkpoint was "
                "written; lower optim.lr or the loss weights (drafter.selector_loss_weight), "
                "or check the data"
            )

    def _mark_skipped(self, record: StepRecord, grad_norm: float | None) -> None:
        """Put the gradient norm in the record and, for a skipped step, say so and log it."""
        record.grad_norm = grad_norm
        record.skipped = grad_norm is None or not math.isfinite(grad_norm)
        if not record.skipped:
            self.nonfinite_in_a_row = 0
            self.applied += 1
            return
        self.nonfinite_in_a_row += 1
        what = f"loss {record.loss}" if grad_norm is None else f"gradient norm {grad_norm}"
        get_logger().warning(
            "step %d skipped: %s; the weights keep their values (%d such steps in a row, "
            "optim.max_nonfinite_steps = %d)", record.step, what, self.nonfinite_in_a_row,
            self.max_nonfinite,
        )  # fmt: skip
