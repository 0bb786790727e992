"""The chunked LM-head cross-entropy equals a naive unchunked reference (CPU, float64)."""

from __future__ import annotations

import torch

from ringtrain.drafter.loss import chunked_head_loss


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

    for chunk in (1, 8, 10, 37, 100):
        test_hidden = hidden.clone().requires_grad_()
        loss, correct = chunked_head_loss(test_hidden, weight, labels, row_weights, chunk)
        (loss * upstream).backward()
        torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=0)
        torch.testing.assert_close(test_hidden.grad, ref_hidden.grad, rtol=1e-6, atol=1e-12)
        assert torch.equal(correct, ref_correct)


def test_zero_weight_rows_get_no_gradient() -> None:
    gen = torch.Generator().manual_seed(1)
    weight = torch.randn(20, 8, generator=gen, dtype=torch.float64)
    hidden = torch.randn(6, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    row_weights = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 1.0], dtype=torch.float64)
    loss, _ = chunked_head_loss(hidden, weight, torch.arange(6), row_weights, 4)
    loss.backward()
    assert hidden.grad[row_weights == 0].abs().max() == 0
    assert hidden.grad[row_weights == 1].abs().min() > 0
