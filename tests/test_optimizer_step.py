"""optimizer_step's switches train as the plain step does: freed gradients exactly, the
clip inside fused AdamW's kernel within rounding, and every path skips a non-finite step."""

from __future__ import annotations

import math

import pytest
import torch

from ringtrain.drafter import build_optimizer, optimizer_step
from ringtrain.drafter.optim import is_fused_adamw
from tests.helpers.tiny_drafter import make_setup, objective, paper_optim

# A clip low enough that every step of the tiny drafter is clipped.
OPTIM = paper_optim(lr=1e-2, warmup_fraction=0.0, grad_clip=0.05)
STEPS = 6


def fused_adamw(model: torch.nn.Module) -> tuple[torch.optim.Optimizer, object]:
    """AdamW with the fused kernel (what build_optimizer picks on CUDA; CPU runs it too)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=OPTIM.lr, fused=True)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)


def train(fused: bool, **switches: bool) -> tuple[list[float], list[float], dict]:
    """STEPS steps on one fixed batch: (losses, gradient norms, final weights)."""
    cfg, model, head, batch = make_setup(seed=4)
    if fused:
        optimizer, scheduler = fused_adamw(model)
    else:
        optimizer, scheduler = build_optimizer(model, OPTIM, STEPS)
    losses, norms = [], []
    for step in range(STEPS):
        sums = objective(model, head, batch, cfg, seed=step)
        (sums.loss_sum / sums.weight_sum).backward()
        norms.append(optimizer_step(model, optimizer, scheduler, OPTIM, **switches))
        losses.append(float(sums.loss_sum.detach() / sums.weight_sum))
    return losses, norms, {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_freed_gradients_train_exactly_as_zeroed_ones() -> None:
    losses, norms, weights = train(fused=False)
    freed_losses, freed_norms, freed_weights = train(fused=False, grads_to_none=True)
    assert freed_losses == losses and freed_norms == norms
    for name, tensor in weights.items():
        assert torch.equal(freed_weights[name], tensor), name


def test_clip_in_fused_adamw_matches_clip_then_step() -> None:
    losses, norms, weights = train(fused=True)
    assert min(norms) > OPTIM.grad_clip, "every step clips"
    in_step_losses, in_step_norms, in_step_weights = train(
        fused=True, clip_in_step=True, grads_to_none=True
    )
    assert in_step_losses[-1] < in_step_losses[0], "it trains"
    # The kernel takes its divisor in float32: this fp64 drafter's clipped gradients
    # differ from clip_grad_norm_'s by float32 rounding (an fp32 drafter's do not).
    assert in_step_losses == pytest.approx(losses, rel=1e-6)
    assert in_step_norms == pytest.approx(norms, rel=1e-6)
    for name, tensor in weights.items():
        torch.testing.assert_close(in_step_weights[name], tensor, rtol=1e-4, atol=1e-8)


@pytest.mark.parametrize("fused", [False, True], ids=["foreach", "fused"])
def test_a_non_finite_gradient_leaves_weights_and_moments_alone(fused: bool) -> None:
    cfg, model, head, batch = make_setup(seed=4)
    optimizer, scheduler = fused_adamw(model) if fused else build_optimizer(model, OPTIM, 4)
    assert is_fused_adamw(optimizer) is fused
    for step in range(2):
        sums = objective(model, head, batch, cfg, seed=step)
        (sums.loss_sum / sums.weight_sum).backward()
        if step == 1:
            before = {k: v.clone() for k, v in model.state_dict().items()}
            moments = {
                id(p): {k: v.clone() for k, v in s.items()} for p, s in optimizer.state.items()
            }
            next(model.parameters()).grad[0] = math.inf
        norm = optimizer_step(
            model, optimizer, scheduler, OPTIM, clip_in_step=True, grads_to_none=True
        )
    assert not math.isfinite(norm)
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, before[name]), name
    for param, state in optimizer.state.items():
        for key, value in state.items():
            assert torch.equal(value, moments[id(param)][key]), key
    assert all(p.grad is None for p in model.parameters())
