"""Muon and AdamW stepping one model together, as one torch optimiser; Muon batched.

torch.optim.Muon takes only 2-D matrices and is meant for hidden layers, so a model is
split between it and AdamW (drafter/optim.py decides the split). `MuonAdamW` joins the
two: its param_groups are the two optimisers' groups (the same dicts, so a scheduler
that sets a group's lr sets it for the part stepping that group), one state dict serves
both (their parameters are disjoint), and step() steps both. Its state_dict is therefore
an ordinary optimiser state dict, which a checkpoint saves and loads like AdamW's.

`BatchedMuon` is torch.optim.Muon with the same update, settings and state, stepped a
shape at a time: the gradients and momenta of all matrices of one shape stacked, their
momentum update and one batched Newton-Schulz orthogonalisation for them, the momenta
and weights written back in multi-tensor passes. torch's steps one matrix at a time,
about twenty small kernels each, which on a small drafter (a few dozen 576-wide matrices)
leaves the GPU waiting on launches for a fifth of the step.

Both take the clip and the non-finite skip as tensors, as the fused AdamW does: a
``grad_scale`` the gradients are divided by and a ``found_inf`` that, where 1, leaves
weights and momenta as they were (drafter/optim.py's optimizer_step sets them), so
stepping needs no host read of the gradient norm.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch

# The attributes an optimiser's step reads its clip divisor and skip flag from (torch's
# mixed-precision scaler sets them on the fused optimisers).
SCALE_HOOKS = ("grad_scale", "found_inf")


class MuonAdamW(torch.optim.Optimizer):
    """`muon` and `adamw` (over disjoint parameters) as one optimiser; see the module docstring."""

    def __init__(self, muon: torch.optim.Muon, adamw: torch.optim.AdamW) -> None:
        self.parts = (muon, adamw)
        super().__init__([*muon.param_groups, *adamw.param_groups], defaults={})
        self._share_groups_and_state()

    def _share_groups_and_state(self) -> None:
        """Point each part at its slice of this optimiser's groups and at its state."""
        start = 0
        for part in self.parts:
            count = len(part.param_groups)
            part.param_groups = self.param_groups[start : start + count]
            part.state = self.state
            start += count

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load as any optimiser does (which replaces the groups and the state), then share
        them with the parts again."""
        super().load_state_dict(state_dict)
        self._share_groups_and_state()

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> None:  # type: ignore[override]
        """One step of both parts (no closure: each part would evaluate it again)."""
        if closure is not None:
            raise ValueError("MuonAdamW.step takes no closure")
        hooks = {name: getattr(self, name) for name in SCALE_HOOKS if hasattr(self, name)}
        for part in self.parts:
            for name, value in hooks.items():
                setattr(part, name, value)
            try:
                part.step()
            finally:
                for name in hooks:
                    delattr(part, name)


# Muon's lr per matrix of shape (rows, cols), by its adjust_lr_fn setting.
_LR_RATIO: dict[str | None, Callable[[int, int], float]] = {
    None: lambda rows, cols: math.sqrt(max(1.0, rows / cols)),
    "original": lambda rows, cols: math.sqrt(max(1.0, rows / cols)),
    "match_rms_adamw": lambda rows, cols: 0.2 * math.sqrt(max(rows, cols)),
}


def orthogonalize(
    matrices: torch.Tensor, coefficients: tuple[float, float, float], steps: int, eps: float
) -> torch.Tensor:
    """Muon's quintic Newton-Schulz iteration on a stack of same-shape matrices [n, r, c],
    in bf16 (torch.optim.Muon's, one matrix at a time there)."""
    a, b, c = coefficients
    ortho = matrices.bfloat16()
    tall = ortho.shape[-2] > ortho.shape[-1]
    if tall:
        ortho = ortho.mT
    ortho = ortho / ortho.norm(dim=(-2, -1), keepdim=True).clamp(min=eps)
    for _ in range(steps):
        gram = ortho @ ortho.mT
        ortho = torch.baddbmm(
            ortho, torch.baddbmm(gram, gram, gram, beta=b, alpha=c), ortho, beta=a
        )
    return ortho.mT if tall else ortho


class BatchedMuon(torch.optim.Muon):
    """torch.optim.Muon stepped a matrix shape at a time (see the module docstring)."""

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> None:  # type: ignore[override]
        """One Muon step of every matrix with a gradient (no closure)."""
        if closure is not None:
            raise ValueError("BatchedMuon.step takes no closure")
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if params:
                self._step_group(group, params)

    def _step_group(self, group: dict[str, Any], params: list[torch.Tensor]) -> None:
        grad_scale = getattr(self, "grad_scale", None)
        found_inf = getattr(self, "found_inf", None)
        momentum, lr = group["momentum"], group["lr"]
        # The decay's factor, 1 where the step is skipped.
        decay = 1 - lr * group["weight_decay"]
        if found_inf is not None:
            decay = 1 - lr * group["weight_decay"] * (1 - found_inf)
        by_shape: dict[torch.Size, list[torch.Tensor]] = defaultdict(list)
        for param in params:
            by_shape[param.shape].append(param)
        for shape, members in by_shape.items():
            momenta = [self._momentum_buffer(param) for param in members]
            grads = torch.stack([param.grad for param in members])
            if grad_scale is not None:
                grads = grads / grad_scale
            before = torch.stack(momenta)
            after = before.lerp(grads, 1 - momentum)
            update = grads.lerp(after, momentum) if group["nesterov"] else after
            ortho = orthogonalize(
                update, group["ns_coefficients"], group["ns_steps"], group["eps"]
            ).to(members[0].dtype)
            if found_inf is not None:
                skip = found_inf.bool()
                after = torch.where(skip, before, after)
                ortho = torch.where(skip, 0.0, ortho)
            torch._foreach_copy_(momenta, after.unbind(0))
            torch._foreach_mul_(members, decay)
            ratio = _LR_RATIO[group["adjust_lr_fn"]](*shape)
            torch._foreach_add_(members, ortho.unbind(0), alpha=-lr * ratio)

    def _momentum_buffer(self, param: torch.Tensor) -> torch.Tensor:
        """The parameter's momentum buffer (zeros at its first step), as torch's Muon keeps it."""
        state = self.state[param]
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(param.grad)
        return state["momentum_buffer"]
