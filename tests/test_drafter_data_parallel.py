"""Two drafters under DDP (gloo, two real processes) train exactly as one drafter does.

One step of two drafters, each on its own batch, must give the weights and Adam moments
that one drafter gives when its loss is the sum over both batches (the same anchors)
normalised by the total weight, and exactly those of the step with the batches swapped;
the bf16 reduction is refused on CPU with the fix; and a drafter that finds no batch
must stop both without anyone waiting in a reduction.
Both architectures: DFlash2's selector loss is computed outside the wrapped module's
forward, and its gradients must be averaged all the same.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from ringtrain.config import Config, RunConfig
from ringtrain.data.config import DataConfig
from ringtrain.drafter import block_objective, optimizer_step
from ringtrain.trainer.data_parallel import wrap_data_parallel
from ringtrain.trainer.drafter_loop import DrafterLoop, DrafterState, Trainee, anchor_seed
from ringtrain.trainer.ledger import BatchLedger
from ringtrain.trainer.signals import StopRequest
from tests.helpers.drafter_loop_parts import RingStandIn, item, make_trainee
from tests.helpers.launcher import run_gloo_pair
from tests.helpers.tiny_drafter import MAX_TOKENS, make_cfg, paper_optim

SEED = 0
ARCHITECTURES = {
    "dflash": {},
    "dflash2": {"architecture": "dflash2", "selector_rank": 8, "selector_top_k": 4},
}


def make_config(architecture: str) -> Config:
    """One step; no clipping, so Adam's first moment keeps the gradient's scale."""
    return Config(
        run=RunConfig(max_steps=1, eval_every=0, checkpoint_every=0, seed=SEED),
        data=DataConfig(token_budget=MAX_TOKENS),
        drafter=make_cfg(**ARCHITECTURES[architecture]),
        optim=paper_optim(lr=1e-2, warmup_fraction=0.0, grad_clip=0.0),
    )


def trained(trainee: Trainee) -> dict[str, list[torch.Tensor]]:
    """The weights and Adam's first moments (0.1 x the step's gradient) after training."""
    params = [p for p in trainee.model.parameters() if p.requires_grad]
    return {
        "weights": [p.detach().clone() for p in params],
        "moments": [trainee.optimizer.state[p]["exp_avg"].clone() for p in params],
    }


def drafter_worker(architecture: str, rank: int, store: str, out: str) -> None:
    """Drafter `rank` of two: one step, the same step with the batches swapped between
    the drafters, then a run where rank 1 has no batch; what it trained is saved to
    `out`/rank.pt."""
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    group = dist.new_group([0, 1])
    with pytest.raises(ValueError, match=r"bfloat16.* needs drafters on CUDA"):
        wrap_data_parallel(make_trainee(make_config(architecture)).model, group, "bfloat16")
    trainee = make_trainee(make_config(architecture))
    ring = RingStandIn([item(rank)])
    loop = DrafterLoop(make_config(architecture), ring.take, ring, trainee, rank, 2, group, 0)
    state = loop.train(DrafterState(0, BatchLedger()), StopRequest())
    results = {"trained": {**trained(trainee), "step": state.step}}
    trainee = make_trainee(make_config(architecture))
    ring = RingStandIn([item(1 - rank)])  # each batch on the other drafter
    DrafterLoop(make_config(architecture), ring.take, ring, trainee, rank, 2, group, 0).train(
        DrafterState(0, BatchLedger()), StopRequest()
    )
    results["swapped"] = trained(trainee)
    trainee = make_trainee(make_config(architecture))
    before = [p.detach().clone() for p in trainee.model.parameters()]
    ring = RingStandIn([item(0)] if rank == 0 else [])
    loop = DrafterLoop(make_config(architecture), ring.take, ring, trainee, rank, 2, group, 0)
    state = loop.train(DrafterState(0, BatchLedger()), StopRequest())
    unchanged = all(
        torch.equal(a, b) for a, b in zip(before, trainee.model.parameters(), strict=True)
    )
    results["stopped"] = {"step": state.step, "unchanged": unchanged, "left": len(ring.items)}
    torch.save(results, Path(out) / f"{rank}.pt")


def one_drafter_on_both_batches(architecture: str) -> dict[str, list[torch.Tensor]]:
    """One drafter, one optimizer step on the sum of both batches' objectives (anchors
    drawn as the drafters draw them for these batches) over their total weight."""
    config = make_config(architecture)
    trainee = make_trainee(config)
    loss, weight = 0.0, 0.0
    for index in (0, 1):
        generator = torch.Generator().manual_seed(anchor_seed(SEED, item(index).meta))
        sums = block_objective(
            trainee.model, trainee.head, item(index), generator, config.drafter, MAX_TOKENS
        )
        loss, weight = loss + sums.loss_sum, weight + sums.weight_sum.item()
    (loss / weight).backward()
    optimizer_step(trainee.model, trainee.optimizer, trainee.scheduler, config.optim)
    return trained(trainee)


def assert_close_lists(got: list[torch.Tensor], want: list[torch.Tensor], **tol) -> None:
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, **tol)


@pytest.mark.slow
@pytest.mark.parametrize("architecture", sorted(ARCHITECTURES))
def test_two_drafters_step_as_one_drafter_on_both_batches(
    architecture: str, tmp_path: Path
) -> None:
    ranks = run_gloo_pair(partial(drafter_worker, architecture), tmp_path)
    want = one_drafter_on_both_batches(architecture)
    for result in ranks:
        got = result["trained"]
        assert got["step"] == 1
        assert_close_lists(got["moments"], want["moments"], rtol=1e-5, atol=1e-8)
        assert_close_lists(got["weights"], want["weights"], rtol=1e-5, atol=1e-6)
        assert result["stopped"] == {"step": 0, "unchanged": True, "left": 0}
    assert_close_lists(
        ranks[0]["trained"]["weights"], ranks[1]["trained"]["weights"], rtol=0, atol=0
    )
    # Which drafter takes which batch changes nothing, bit for bit: a batch's anchors
    # follow the batch, and the reduction of two gradients is one (commutative) addition.
    for key in ("weights", "moments"):
        assert_close_lists(ranks[0]["swapped"][key], ranks[0]["trained"][key], rtol=0, atol=0)
