"""A fresh drafter's first step against a trained target's tied head: the loss starts near
ln(vocab), not far above it, and the first gradient is modest.

A trained chat model's embedding rows have norms of a few units (SmolLM2-135M: 3.2 on
average) and its LM head is the same matrix. The drafter's block slots start as the mask
token's embedding brought to RMS 1 by the final norm, which such a head scores with a
logit of row norm x sqrt(hidden) (tens) for the mask token itself.

A fresh drafter's initial weights come from run.seed alone (seeded_drafter): the same
on every drafter rank and in every run with that seed, whatever the global random state."""

from __future__ import annotations

import math

import pytest
import torch

from ringtrain.drafter import DFlashDrafter, FrozenHead, drafter_spec_from_target, seeded_drafter
from ringtrain.packed_batch import random_packed_batch
from tests.helpers.tiny_drafter import TAPS, TARGET, all_visible, make_cfg, objective

TRAINED_ROW_NORM = 3.2
VOCAB = TARGET["vocab_size"]


def trained_tied_head(seed: int = 0) -> FrozenHead:
    """A tied embedding/head whose rows have the norm of a trained model's."""
    gen = torch.Generator().manual_seed(seed)
    rows = torch.randn(VOCAB, TARGET["hidden_size"], generator=gen, dtype=torch.float64)
    embed = rows * (TRAINED_ROW_NORM / rows.norm(dim=1, keepdim=True))
    return FrozenHead(embed, embed)


def first_step(fit: bool) -> tuple[float, float]:
    """(loss, gradient norm) of a fresh drafter's first step, its output scale fitted or not."""
    cfg = make_cfg()
    torch.manual_seed(0)
    model = DFlashDrafter(drafter_spec_from_target(TARGET, cfg, TAPS)).double()
    head = trained_tied_head()
    if fit:
        model.fit_output_scale(head)
    batch = random_packed_batch([70, 45, 30], 3 * 32, VOCAB, "cpu", torch.float64, 0)
    sums = objective(model, head, batch, cfg, seed=0)
    loss = sums.loss_sum / sums.weight_sum
    loss.backward()
    grads = [p.grad.norm() for p in model.parameters() if p.grad is not None]
    return float(loss.detach()), float(torch.stack(grads).norm())


def test_the_first_loss_is_bounded_by_twice_ln_vocab() -> None:
    unfitted_loss, unfitted_grad = first_step(fit=False)
    loss, grad = first_step(fit=True)
    assert unfitted_loss > 2 * math.log(VOCAB), "the head no longer shows the problem"
    assert loss < 2 * math.log(VOCAB), (
        f"first-step loss {loss:.2f}, ln(vocab) {math.log(VOCAB):.2f}"
    )
    assert grad < unfitted_grad, f"first gradient norm {grad:.2f} (unfitted {unfitted_grad:.2f})"


def test_the_fitted_output_gives_the_mask_state_logits_of_unit_spread() -> None:
    """fit_output_scale's promise: the mask token's state, through the final norm, gets
    logits of standard deviation 1 from the head; and a fresh drafter's block slots, whose
    residual stream is mostly that state, come out near unit spread too."""
    cfg = make_cfg()
    torch.manual_seed(0)
    model = DFlashDrafter(drafter_spec_from_target(TARGET, cfg, TAPS)).double()
    head = trained_tied_head()
    scale = model.fit_output_scale(head)
    assert 0 < scale < 1, "a trained head's logits are wider than unit spread"
    context = torch.randn(40, len(TAPS) * TARGET["hidden_size"], dtype=torch.float64)
    block = torch.full((cfg.block_size,), model.spec.mask_token_id)
    with torch.no_grad():
        state = model.norm(head.embed[model.spec.mask_token_id])
        assert float((head.lm_head @ state).std()) == pytest.approx(1.0, rel=1e-4)
        slots = model(
            context, torch.arange(40), head.embed[block], torch.arange(40, 40 + cfg.block_size),
            all_visible(cfg.block_size, 40 + cfg.block_size, cfg.num_layers),
        )  # fmt: skip
    spread = (slots @ head.lm_head.T).std(dim=-1)
    assert spread.min() > 0.9 and spread.max() < 1.1, spread


def test_a_head_of_small_weights_keeps_the_unit_norm() -> None:
    cfg = make_cfg()
    model = DFlashDrafter(drafter_spec_from_target(TARGET, cfg, TAPS))
    small = FrozenHead.random(VOCAB, TARGET["hidden_size"], "cpu", torch.float32)
    assert model.fit_output_scale(small) == 1.0
    assert torch.equal(model.norm.weight, torch.ones_like(model.norm.weight))


@pytest.mark.parametrize("architecture", ["dflash", "dflash2"])
def test_a_fresh_drafter_is_initialised_from_the_seed_alone(architecture: str) -> None:
    extra = {"selector_rank": 8, "selector_top_k": 4} if architecture == "dflash2" else {}
    spec = drafter_spec_from_target(TARGET, make_cfg(architecture=architecture, **extra), TAPS)
    cpu = torch.device("cpu")
    torch.manual_seed(1)
    first = seeded_drafter(spec, cpu, seed=7).state_dict()
    after_first = torch.rand(4)
    torch.manual_seed(2)  # another global random state: the drafter must not see it
    second = seeded_drafter(spec, cpu, seed=7).state_dict()
    other = seeded_drafter(spec, cpu, seed=8).state_dict()
    assert first.keys() == second.keys()
    assert all(torch.equal(first[name], second[name]) for name in first)
    assert not torch.equal(first["fc.weight"], other["fc.weight"])
    torch.manual_seed(1)
    assert torch.equal(torch.rand(4), after_first), "building a drafter moved the global RNG"
