"""Two drafters under DDP (gloo, two real processes) take the same skip decision.

A non-finite loss on one drafter's batch makes the global loss non-finite, and an inf in
one drafter's local gradient makes the reduced gradient (the same on both) non-finite:
both drafters skip the same steps, run backward in the same steps (so nobody waits in a
reduction), and end with the same finite weights.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from ringtrain.config import Config, RunConfig
from ringtrain.data.config import DataConfig
from ringtrain.trainer.drafter_loop import DrafterLoop, DrafterState
from ringtrain.trainer.ledger import BatchLedger
from ringtrain.trainer.signals import StopRequest
from tests.helpers.drafter_loop_parts import ReporterStandIn, RingStandIn, item, make_trainee
from tests.helpers.launcher import run_gloo_pair
from tests.helpers.tiny_drafter import MAX_TOKENS, make_cfg, paper_optim

STEPS = 4


def worker(rank: int, store: str, out: str) -> None:
    """Drafter `rank`: step 2 has a NaN loss on drafter 0's batch, step 3 an inf in
    drafter 1's local gradient; saves its step records' skip flags and its weights."""
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    group = dist.new_group([0, 1])
    config = Config(
        run=RunConfig(max_steps=STEPS, eval_every=0, checkpoint_every=0),
        data=DataConfig(token_budget=MAX_TOKENS),
        drafter=make_cfg(),
        optim=paper_optim(lr=1e-2, warmup_fraction=0.0),
    )
    trainee = make_trainee(config)
    items = [item(2 * step + rank, poison=rank == 0 and step == 1) for step in range(STEPS)]
    backwards: list[None] = []

    def explode_in_the_second_backward(grad: torch.Tensor) -> torch.Tensor:
        backwards.append(None)
        return grad * math.inf if rank == 1 and len(backwards) == 2 else grad

    trainee.model.fc.weight.register_hook(explode_in_the_second_backward)
    ring, reporter = RingStandIn(items), ReporterStandIn()
    loop = DrafterLoop(config, ring.take, ring, trainee, rank, 2, group, 0)
    loop.train(DrafterState(0, BatchLedger()), StopRequest(), reporter)
    weights = [p.detach().clone() for p in trainee.model.parameters()]
    skipped = [record.skipped for record in reporter.steps]
    torch.save({"skipped": skipped, "weights": weights}, Path(out) / f"{rank}.pt")


@pytest.mark.slow
def test_both_drafters_skip_the_same_non_finite_steps(tmp_path: Path) -> None:
    ranks = run_gloo_pair(worker, tmp_path)
    for result in ranks:
        assert result["skipped"] == [False, True, True, False]
        assert all(torch.isfinite(w).all() for w in result["weights"])
    for a, b in zip(ranks[0]["weights"], ranks[1]["weights"], strict=True):
        assert torch.equal(a, b)
