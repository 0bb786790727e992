"""optimizer_step's switches train as the plain step does: freed gradients exactly, the
clip inside the optimiser's step (fused AdamW, Muon beside a fused AdamW) within rounding,
whether the clip bites or not; grad_clip 0 turns the clip off on every path; and every path
skips a non-finite step, leaving weights, moments and momenta alone."""

from __future__ import annotations

import math

import pytest
import torch

from ringtrain.drafter import build_optimizer, optimizer_step
from ringtrain.drafter.config import OptimConfig
from ringtrain.drafter.muon import BatchedMuon, MuonAdamW
from ringtrain.drafter.optim import clips_in_step, hidden_matrices
from tests.helpers.tiny_drafter import make_setup, objective, paper_optim

# A clip low enough that every step of the tiny drafter is clipped.
OPTIM = paper_optim(lr=1e-2, warmup_fraction=0.0, grad_clip=0.05)
# One high enough that none is.
UNCLIPPED = paper_optim(lr=1e-2, warmup_fraction=0.0, grad_clip=1e3)
STEPS = 6


def in_step_optimizer(model: torch.nn.Module, name: str) -> torch.optim.Optimizer:
    """What build_optimizer picks on CUDA, on this CPU: AdamW with its fused kernel
    (``adamw``), or Muon on the layers' matrices beside it (``muon``)."""
    if name == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=OPTIM.lr, fused=True)
    hidden = hidden_matrices(model)
    rest = [p for p in model.parameters() if all(p is not h for h in hidden)]
    muon = BatchedMuon(hidden, lr=OPTIM.lr, adjust_lr_fn="match_rms_adamw")
    return MuonAdamW(muon, torch.optim.AdamW(rest, lr=OPTIM.lr, fused=True))


def train(
    name: str | None, optim: OptimConfig = OPTIM, **switches: bool
) -> tuple[list[float], list[float], dict]:
    """STEPS steps on one fixed batch with build_optimizer's choice (``name`` None) or
    `in_step_optimizer`'s under `optim`: (losses, gradient norms, final weights)."""
    cfg, model, head, batch = make_setup(seed=4)
    if name is None:
        optimizer, scheduler = build_optimizer(model, optim, STEPS)
    else:
        optimizer = in_step_optimizer(model, name)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    losses, norms = [], []
    for step in range(STEPS):
        sums = objective(model, head, batch, cfg, seed=step)
        (sums.loss_sum / sums.weight_sum).backward()
        norms.append(float(optimizer_step(model, optimizer, scheduler, optim, **switches)))
        losses.append(float(sums.loss_sum.detach() / sums.weight_sum))
    return losses, norms, {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_freed_gradients_train_exactly_as_zeroed_ones() -> None:
    losses, norms, weights = train(None)
    freed_losses, freed_norms, freed_weights = train(None, grads_to_none=True)
    assert freed_losses == losses and freed_norms == norms
    for name, tensor in weights.items():
        assert torch.equal(freed_weights[name], tensor), name


@pytest.mark.parametrize("optim", [OPTIM, UNCLIPPED], ids=["every-step-clips", "none-clips"])
@pytest.mark.parametrize("name", ["adamw", "muon"])
def test_clip_in_the_step_matches_clip_then_step(name: str, optim: OptimConfig) -> None:
    losses, norms, weights = train(name, optim)
    if optim is OPTIM:
        assert min(norms) > optim.grad_clip, "every step clips"
    else:
        assert max(norms) < optim.grad_clip, "no step clips"
    in_step_losses, in_step_norms, in_step_weights = train(
        name, optim, clip_in_step=True, grads_to_none=True
    )
    assert in_step_losses[-1] < in_step_losses[0], "it trains"
    # The kernels take the divisor in float32: this fp64 drafter's clipped gradients
    # differ from clip_grad_norm_'s by float32 rounding (an fp32 drafter's do not).
    assert in_step_losses == pytest.approx(losses, rel=1e-6)
    assert in_step_norms == pytest.approx(norms, rel=1e-6)
    # Muon rounds its orthogonalised update to bf16. Where no step clips, the fused AdamW's
    # float32 handling of the divisor moves the other weights by about 1e-7, and that
    # rounding turns it into a bf16 step of one of Muon's matrices' entries (times lr and
    # the shape's lr ratio: 2.5e-4 here). Where every step clips it stays within 1e-8.
    atol = 1e-3 if name == "muon" and optim is UNCLIPPED else 1e-8
    for key, tensor in weights.items():
        torch.testing.assert_close(in_step_weights[key], tensor, rtol=1e-4, atol=atol)


@pytest.mark.parametrize("clip_in_step", [False, True], ids=["clip-then-step", "in-step"])
@pytest.mark.parametrize("name", [None, "adamw", "muon"], ids=["foreach", "fused", "muon"])
def test_a_grad_clip_of_zero_turns_the_clip_off(name: str | None, clip_in_step: bool) -> None:
    """optim.grad_clip = 0 trains exactly as a clip that never bites."""
    off = paper_optim(lr=1e-2, warmup_fraction=0.0, grad_clip=0.0)
    never = paper_optim(lr=1e-2, warmup_fraction=0.0, grad_clip=1e9)
    losses, norms, weights = train(name, off, clip_in_step=clip_in_step)
    never_losses, never_norms, never_weights = train(name, never, clip_in_step=clip_in_step)
    assert (never_losses, never_norms) == (losses, norms)
    for key, tensor in weights.items():
        assert torch.equal(never_weights[key], tensor), key
    assert losses[-1] < losses[0], "it trains"


@pytest.mark.parametrize("name", [None, "adamw", "muon"], ids=["foreach", "fused", "muon"])
def test_a_non_finite_gradient_leaves_weights_and_moments_alone(name: str | None) -> None:
    cfg, model, head, batch = make_setup(seed=4)
    if name is None:
        optimizer, scheduler = build_optimizer(model, OPTIM, 4)
    else:
        optimizer = in_step_optimizer(model, name)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    assert clips_in_step(optimizer) is (name is not None)
    for step in range(2):
        sums = objective(model, head, batch, cfg, seed=step)
        (sums.loss_sum / sums.weight_sum).backward()
        if step == 1:
            before = {k: v.clone() for k, v in model.state_dict().items()}
            moments = {
                id(p): {k: v.clone() for k, v in s.items()} for p, s in optimizer.state.items()
            }
            # A matrix Muon steps, and with it every matrix of its shape.
            hidden_matrices(model)[0].grad[0] = math.inf
            next(model.parameters()).grad[0] = math.nan
        norm = optimizer_step(
            model, optimizer, scheduler, OPTIM, clip_in_step=True, grads_to_none=True
        )
    assert not math.isfinite(norm)
    for key, tensor in model.state_dict().items():
        assert torch.equal(tensor, before[key]), key
    assert len(moments) == len(list(model.parameters()))
    for param, state in optimizer.state.items():
        for key, value in state.items():
            assert torch.equal(value, moments[id(param)][key]), key
    assert all(p.grad is None for p in model.parameters())
