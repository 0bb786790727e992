"""Parts that drive the drafter's training loop in one process, without a ring: stand-ins
for the ring and the reporter, ring items of random batches, and a trainee."""

from __future__ import annotations

import math
from collections import deque

import torch

from ringtrain.batch import HIDDEN, TOKEN_ARRAYS
from ringtrain.config import Config
from ringtrain.drafter import FrozenHead, build_drafter, build_optimizer, drafter_spec_from_target
from ringtrain.packed_batch import random_packed_batch
from ringtrain.ring import ReadItem
from ringtrain.trainer.batch_meta import BatchKind, BatchMeta
from ringtrain.trainer.drafter_loop import Trainee
from ringtrain.trainer.step_record import StepRecord
from tests.helpers.tiny_drafter import DOCS, TAPS, TARGET


class RowStandIn:
    """A rank's row: progress recorded, GPU busy checked."""

    def __init__(self) -> None:
        self.progress: list[int] = []

    def record_progress(self, count: int) -> None:
        self.progress.append(count)

    def report_gpu_busy(self, fraction: float | None) -> None:
        assert fraction is None  # no NVML on CPU


class RingStandIn:
    """Items from a list (None once it is empty); the rank's row a RowStandIn."""

    def __init__(self, items: list[ReadItem]) -> None:
        self.items = deque(items)
        self.own_row = RowStandIn()

    def take(self) -> ReadItem | None:
        return self.items.popleft() if self.items else None

    def gpu_busy_by_rank(self) -> dict[int, float]:
        return {}


class ReporterStandIn:
    """Step records and evaluations kept in lists."""

    def __init__(self) -> None:
        self.steps: list[StepRecord] = []
        self.evaluations: list[tuple[int, dict]] = []

    def step(self, record: StepRecord) -> None:
        self.steps.append(record)

    def evaluation(self, step: int, metrics: dict) -> None:
        self.evaluations.append((step, metrics))


def item(
    seq: int, kind: BatchKind = BatchKind.TRAIN, poison: bool = False, round_id: int = 1
) -> ReadItem:
    """Ring item `seq`: a random batch of DOCS for the tiny drafter (NaN features if
    `poison`); an evaluation item belongs to held-out round `round_id`."""
    batch = random_packed_batch(
        DOCS, len(TAPS) * TARGET["hidden_size"], 64, "cpu", torch.float32, seq
    )
    hidden = batch.hidden * math.nan if poison else batch.hidden
    round_id = round_id if kind == BatchKind.EVAL else 0
    meta = BatchMeta(batch_id=100 + seq, epoch=0, seq=seq, producer=0, kind=kind, round=round_id)
    arrays = {f.name: getattr(batch, f.name) for f in TOKEN_ARRAYS}
    return ReadItem(
        arrays={**arrays, HIDDEN: hidden},
        num_tokens=batch.num_tokens, num_docs=batch.num_docs, meta=meta, producer_rank=0, seq=seq,
    )  # fmt: skip


def make_trainee(config: Config) -> Trainee:
    """The tiny drafter of `config` (seeded), a random frozen head and their optimizer."""
    torch.manual_seed(0)
    model = build_drafter(drafter_spec_from_target(TARGET, config.drafter, TAPS))
    embed, lm_head = torch.randn(2, 64, TARGET["hidden_size"]) * 0.5
    optimizer, scheduler = build_optimizer(model, config.optim, config.run.max_steps)
    return Trainee(model, FrozenHead(embed, lm_head), optimizer, scheduler)
