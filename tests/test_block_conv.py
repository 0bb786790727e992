"""DFlash2's in-block convolution op: its output is the definition's, its own backward is
the output's exact gradient, and Dynamo / the fake-tensor path accept it."""

from __future__ import annotations

import pytest
import torch

from ringtrain.drafter.arch.dflash2.block_conv import block_conv


def definition(x: torch.Tensor, delta: torch.Tensor, base: torch.Tensor, block: int):
    """out[t, c] = sum_j (base[j, c] + delta[t, j, c // group]) * x[t - j, c], one entry at
    a time, taps stopping at the block's start."""
    rows, hidden = x.shape
    taps, groups = delta.shape[1], delta.shape[2]
    group = hidden // groups
    out = torch.zeros_like(x)
    for t in range(rows):
        for c in range(hidden):
            for j in range(taps):
                if t % block >= j:
                    out[t, c] += (base[j, c] + delta[t, j, c // group]) * x[t - j, c]
    return out


def _inputs(rows: int, hidden: int, taps: int, groups: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, hidden, generator=gen, dtype=torch.float64)
    delta = torch.randn(rows, taps, groups, generator=gen, dtype=torch.float64)
    base = torch.randn(taps, hidden, generator=gen, dtype=torch.float64)
    return x, delta, base


@pytest.mark.parametrize(("taps", "block"), [(1, 4), (2, 4), (3, 4), (4, 4)])
def test_the_output_is_the_definition(taps: int, block: int) -> None:
    x, delta, base = _inputs(rows=3 * block, hidden=8, taps=taps, groups=4)
    torch.testing.assert_close(
        block_conv(x, delta, base, block), definition(x, delta, base, block), rtol=1e-12, atol=0
    )


@pytest.mark.parametrize(("taps", "block"), [(1, 4), (2, 4), (3, 5)])
def test_its_backward_is_the_outputs_gradient(taps: int, block: int) -> None:
    """gradcheck: the op's own backward against finite differences of its output, for the
    input, the corrections and the base kernel."""
    x, delta, base = (t.requires_grad_() for t in _inputs(2 * block, 6, taps, groups=3, seed=1))
    assert torch.autograd.gradcheck(lambda *a: block_conv(*a, block), (x, delta, base))


def test_a_strided_correction_view_and_mixed_dtypes() -> None:
    """The corrections come in as a view of one projection holding both sides; the
    output's dtype is the promoted one, the gradients keep each input's dtype."""
    x, both, base = _inputs(rows=8, hidden=8, taps=4, groups=4, seed=2)
    both, base = both.view(8, 2, 2, 4).float().requires_grad_(), base[:2]
    x = x.float().requires_grad_()
    out = block_conv(x, both[:, 1], base.float(), 4)
    expected = definition(x.detach(), both.detach()[:, 1], base.float(), 4)
    torch.testing.assert_close(out, expected)
    out.sum().backward()
    assert both.grad is not None and torch.count_nonzero(both.grad[:, 0]) == 0
    assert torch.count_nonzero(both.grad[:, 1]) > 0


def test_the_op_passes_torch_library_opcheck() -> None:
    """Schema, fake tensors (what torch.compile traces with) and the registered autograd
    agree with the op's real outputs."""
    x, delta, base = (t.float().requires_grad_() for t in _inputs(8, 8, 2, 4, seed=3))
    torch.library.opcheck(torch.ops.ringtrain.block_conv.default, (x, delta, base, 4))


def test_compiled_as_in_the_drafter() -> None:
    """Under torch.compile the op and its backward give eager's values."""
    x, delta, base = _inputs(8, 8, 2, 4, seed=4)

    def loss(x, delta, base):
        return (block_conv(x * 2.0, delta, base, 4) ** 2).sum()

    eager_args = [t.clone().requires_grad_() for t in (x, delta, base)]
    compiled_args = [t.clone().requires_grad_() for t in (x, delta, base)]
    loss(*eager_args).backward()
    torch.compile(loss, fullgraph=True)(*compiled_args).backward()
    for eager, compiled in zip(eager_args, compiled_args, strict=True):
        torch.testing.assert_close(compiled.grad, eager.grad, rtol=1e-12, atol=1e-12)
