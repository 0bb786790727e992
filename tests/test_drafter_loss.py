"""The chunked LM-head cross-entropy equals a naive unchunked reference; D-PACE weights by hand."""

from __future__ import annotations

import math
from functools import partial

import pytest
import torch

from ringtrain.drafter.loss import (
    ChunkFns,
    chunked_head_loss,
    dpace_weights,
    grouped_argmax,
    grouped_lse,
    top_ids,
)


def naive_loss(hidden, weight, labels, row_weights):
    logits = hidden @ weight.t()
    ce = torch.nn.functional.cross_entropy(logits, labels, reduction="none")
    return (ce * row_weights).sum(), logits.argmax(-1) == labels


def test_chunked_loss_and_gradient_match_the_reference() -> None:
    gen = torch.Generator().manual_seed(0)
    rows, hidden_size, vocab = 37, 16, 50
    weight = torch.randn(vocab, hidden_size, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, vocab, (rows,), generator=gen)
    row_weights = torch.rand(rows, generator=gen, dtype=torch.float64)
    row_weights[::5] = 0.0  # unscored rows
    hidden = torch.randn(rows, hidden_size, generator=gen, dtype=torch.float64) * 3
    upstream = torch.tensor(0.7, dtype=torch.float64)

    ref_hidden = hidden.clone().requires_grad_()
    ref_loss, ref_correct = naive_loss(ref_hidden, weight, labels, row_weights)
    (ref_loss * upstream).backward()

    ref_top_logits, ref_top = (hidden @ weight.t()).topk(4, dim=-1)
    for chunk in (1, 8, 10, 37, 100):
        test_hidden = hidden.clone().requires_grad_()
        loss, correct, top_ids, top_logits = chunked_head_loss(
            test_hidden, weight, labels, row_weights, chunk, ChunkFns(top_k=4)
        )
        (loss * upstream).backward()
        torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=0)
        torch.testing.assert_close(test_hidden.grad, ref_hidden.grad, rtol=1e-6, atol=1e-12)
        assert torch.equal(correct, ref_correct)
        assert torch.equal(top_ids, ref_top)
        torch.testing.assert_close(top_logits, ref_top_logits, rtol=1e-12, atol=0)
        assert not top_logits.requires_grad
        with torch.no_grad():
            _, _, top_ids, top_logits = chunked_head_loss(
                hidden, weight, labels, row_weights, chunk, ChunkFns(top_k=4)
            )
        assert torch.equal(top_ids, ref_top)
        torch.testing.assert_close(top_logits, ref_top_logits, rtol=1e-12, atol=0)


def test_zero_weight_rows_get_no_gradient() -> None:
    gen = torch.Generator().manual_seed(1)
    weight = torch.randn(20, 8, generator=gen, dtype=torch.float64)
    hidden = torch.randn(6, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    row_weights = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 1.0], dtype=torch.float64)
    loss, *_ = chunked_head_loss(hidden, weight, torch.arange(6), row_weights, 4)
    loss.backward()
    assert hidden.grad[row_weights == 0].abs().max() == 0
    assert hidden.grad[row_weights == 1].abs().min() > 0


def test_dpace_weights_by_hand() -> None:
    # Block 1: q = 1, 0.5, 0.2 -> s = 1, 0.75, 0.6 -> reach 1, 0.75, 0.45.
    # Block 2: slot 2 unscored: q = 0.6, -, 0.2 -> s = 0.8, (1), 0.6 -> reach 0.8, -, 0.48.
    q = torch.tensor([1.0, 0.5, 0.2, 0.6, 0.9, 0.2], dtype=torch.float64)
    scored = torch.tensor([1, 1, 1, 1, 0, 1], dtype=torch.float64)
    weights = dpace_weights(-q.log(), scored, alpha=0.5, slots=3)
    expected = [1 + 0.75 + 0.45, 0.75 + 0.45, 0.45, 0.8 + 0.48, 0.0, 0.48]
    torch.testing.assert_close(weights, torch.tensor(expected, dtype=torch.float64))
    uniform = dpace_weights(-q.log(), scored, alpha=1.0, slots=3)
    assert uniform.tolist() == [3.0, 2.0, 1.0, 2.0, 0.0, 1.0]


def test_dpace_loss_and_gradient_match_autograd_with_detached_weights() -> None:
    gen = torch.Generator().manual_seed(2)
    slots, blocks, hidden_size, vocab = 5, 7, 12, 30
    rows = slots * blocks
    weight = torch.randn(vocab, hidden_size, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, vocab, (rows,), generator=gen)
    scored = (torch.rand(rows, generator=gen) > 0.2).double()
    hidden = torch.randn(rows, hidden_size, generator=gen, dtype=torch.float64)
    reweight = partial(dpace_weights, alpha=0.3, slots=slots)

    ref_hidden = hidden.clone().requires_grad_()
    ce = torch.nn.functional.cross_entropy(ref_hidden @ weight.t(), labels, reduction="none")
    ref_loss = (ce * reweight(ce.detach(), scored)).sum()
    ref_loss.backward()

    for chunk in (1, 6, 11, rows):
        fns = ChunkFns(reweight=reweight, group=slots)
        test_hidden = hidden.clone().requires_grad_()
        loss, *_ = chunked_head_loss(test_hidden, weight, labels, scored, chunk, fns)
        loss.backward()
        torch.testing.assert_close(loss, ref_loss, rtol=1e-9, atol=0)
        torch.testing.assert_close(test_hidden.grad, ref_hidden.grad, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize(("vocab", "top_k"), [(4096, 16), (1000, 7), (96, 5), (130, 3)])
def test_top_ids_are_the_rows_top_k_in_order(vocab: int, top_k: int) -> None:
    """The two-pass top-k equals torch.topk (distinct values), groups dividing the
    vocabulary or not, and with fewer groups than top_k (96 / 64 -> 3 groups of 32)."""
    torch.manual_seed(0)
    logits = torch.randn(64, vocab)
    # Plant each row's largest entries in one group, which a one-per-group rule would miss.
    logits[:, 64:72] += 10.0
    maxima, _ = grouped_lse(logits)
    assert torch.equal(top_ids(logits, top_k, maxima), logits.topk(top_k, dim=-1).indices)
    assert top_ids(logits, 0, maxima).shape == (64, 0)


def test_the_log_sum_exp_through_group_maxima_is_the_rows_even_with_groups_of_minus_inf() -> None:
    """The log-sum-exp is read off each group's own (one pass with the maxima top_ids
    ranks): it equals torch.logsumexp, also where a whole group is -inf; a row's top id
    and the argmax found through the groups are its argmax (the first of equal ones)."""
    torch.manual_seed(1)
    logits = torch.randn(8, 256, dtype=torch.float64) * 5
    logits[:, :64] = -math.inf
    maxima, lse = grouped_lse(logits)
    torch.testing.assert_close(lse, torch.logsumexp(logits, dim=-1), rtol=1e-12, atol=0)
    assert torch.equal(maxima, logits.view(8, 4, 64).amax(-1))
    assert torch.equal(top_ids(logits, 3, maxima)[:, 0], logits.argmax(-1))
    logits[3, 100] = logits[3, 200] = logits[3, 201] = 50.0  # equal largest: the first
    maxima, _ = grouped_lse(logits)
    assert torch.equal(grouped_argmax(logits, maxima), logits.argmax(-1))
