"""Mixture-of-experts experts for compiled targets: grouped GEMMs and a one-kernel combine.

transformers' "grouped_mm" experts sort the token-expert pairs by expert, run each expert
over its rows in two grouped GEMMs, then combine: every token's output is the
routing-weighted sum of its top-k rows. They write the combine as a product, a gather
back to token order and a sum over k; compiled with dynamic sizes (as ringtrain compiles
target layers) that is one kernel running at about an eighth of the chip's bandwidth, 19%
of a Qwen3-30B-A3B batch on an H200 (BENCHMARKS.md).

`grouped_experts_forward` computes the same as transformers' grouped_mm path for experts
of the plain layout (gated, no biases, no norm after the experts, no expert parallelism:
`fits_grouped_experts`), with the combine as one op, ``ringtrain::moe_combine``: on CUDA
a Triton kernel that reads each token's k rows once, multiplies by the routing weights
and sums in float32 (one rounding at the end, where the reference rounds the products
too); elsewhere the same in torch. It is a custom op, so Dynamo keeps it whole inside
the compiled layer; it has no backward (the target is frozen and runs under
inference_mode). `use_grouped_experts` swaps it in, as an experts implementation
registered with transformers.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

# The experts implementation's name in transformers' experts interface.
GROUPED_EXPERTS = "ringtrain_grouped_mm"
# Columns of a row one program of the combine kernel sums.
COMBINE_BLOCK = 1024


def fits_grouped_experts(experts: nn.Module) -> bool:
    """Whether ``experts`` has the plain layout `grouped_experts_forward` computes: stacked
    gate|up and down weights with the experts' own gating of them, no biases, no norm after
    the experts, no expert parallelism."""
    gate_up, down = (getattr(experts, name, None) for name in ("gate_up_proj", "down_proj"))
    return (
        isinstance(gate_up, torch.Tensor)
        and isinstance(down, torch.Tensor)
        and gate_up.dim() == down.dim() == 3
        and getattr(experts, "has_gate", True)
        and hasattr(experts, "_apply_gate")
        and getattr(experts, "gate_up_proj_bias", None) is None
        and getattr(experts, "down_proj_bias", None) is None
        and not getattr(experts, "has_post_expert_norm", False)
        and not getattr(experts, "_is_expert_parallel", False)
    )


def use_grouped_experts(experts: nn.Module) -> None:
    """Run ``experts`` (and every experts module sharing its config: a model's layers do)
    by `grouped_experts_forward`, through transformers' experts interface: the config
    names `GROUPED_EXPERTS`, so every layer dispatches alike and one compiled graph
    serves them all. Call only where `fits_grouped_experts` and transformers runs the
    experts by "grouped_mm" (so its experts interface exists)."""
    from transformers.integrations.moe import ExpertsInterface

    ExpertsInterface.register(GROUPED_EXPERTS, grouped_experts_forward)
    experts.config._experts_implementation = GROUPED_EXPERTS


def _grouped_linear(rows: torch.Tensor, weight: torch.Tensor, offsets, transposed: bool):
    """rows [S, in] through per-expert weights [E, out, in] ([E, in, out] if transposed)."""
    weight = weight if transposed else weight.transpose(-2, -1)
    grouped_mm = getattr(F, "grouped_mm", None) or torch._grouped_mm
    return grouped_mm(rows.to(weight.dtype), weight, offs=offsets)


def grouped_experts_forward(
    experts: nn.Module,
    hidden_states: torch.Tensor,
    top_k_index: torch.Tensor,
    top_k_weights: torch.Tensor,
) -> torch.Tensor:
    """Outputs [T, H] of tokens hidden_states [T, H] routed to experts top_k_index [T, k]
    with weights top_k_weights [T, k] (experts of another layout sharing the config run by
    transformers' grouped_mm)."""
    if not fits_grouped_experts(experts):
        from transformers.integrations.moe import grouped_mm_experts_forward

        return grouped_mm_experts_forward(experts, hidden_states, top_k_index, top_k_weights)
    top_k = top_k_index.shape[1]
    expert_of_row, order = torch.sort(top_k_index.reshape(-1))
    rows = hidden_states[order // top_k]
    # histc counts integers on CUDA and floats on CPU (both exact at these sizes).
    counted = expert_of_row.int() if expert_of_row.is_cuda else expert_of_row.float()
    per_expert = torch.histc(counted, bins=experts.num_experts, min=0, max=experts.num_experts - 1)
    offsets = torch.cumsum(per_expert, dim=0, dtype=torch.int32)
    transposed = getattr(experts, "is_transposed", False)
    gated = experts._apply_gate(_grouped_linear(rows, experts.gate_up_proj, offsets, transposed))
    out = _grouped_linear(gated, experts.down_proj, offsets, transposed)
    row_of_pick = torch.empty_like(order)
    row_of_pick[order] = torch.arange(order.numel(), device=order.device)
    combined = torch.ops.ringtrain.moe_combine(out, row_of_pick, top_k_weights)
    return combined.to(hidden_states.dtype)


@torch.library.custom_op("ringtrain::moe_combine", mutates_args=())
def moe_combine(
    rows: torch.Tensor, row_of_pick: torch.Tensor, weights: torch.Tensor
) -> torch.Tensor:
    """out[t] = sum_j weights[t, j] * rows[row_of_pick[t * k + j]]: rows [S, H] in expert
    order, row_of_pick [T * k] the row of each (token, pick), weights [T, k]; out [T, H]."""
    if rows.is_cuda:
        return _combine_cuda(rows, row_of_pick, weights)
    tokens, top_k = weights.shape
    picked = rows[row_of_pick].view(tokens, top_k, rows.shape[1]).float()
    return (picked * weights.float()[..., None]).sum(1).to(rows.dtype)


@moe_combine.register_fake
def _(rows: torch.Tensor, row_of_pick: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    return rows.new_empty(weights.shape[0], rows.shape[1])


def _combine_cuda(rows: torch.Tensor, row_of_pick: torch.Tensor, weights: torch.Tensor):
    tokens, top_k = weights.shape
    hidden = rows.shape[1]
    out = rows.new_empty(tokens, hidden)
    rows, row_of_pick, weights = rows.contiguous(), row_of_pick.contiguous(), weights.contiguous()
    grid = (tokens, -(-hidden // COMBINE_BLOCK))
    _combine_kernel()[grid](rows, row_of_pick, weights, out, hidden, top_k, COMBINE_BLOCK)
    return out


@functools.cache
def _combine_kernel():
    """The Triton kernel (imported on first CUDA use: CPU installs have no Triton)."""
    import triton
    import triton.language as tl

    @triton.jit
    def combine(rows, row_of_pick, weights, out, hidden, TOP_K: tl.constexpr, BLOCK: tl.constexpr):
        token = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        inside = cols < hidden
        total = tl.zeros((BLOCK,), dtype=tl.float32)
        for pick in tl.static_range(TOP_K):
            row = tl.load(row_of_pick + token * TOP_K + pick).to(tl.int64)
            weight = tl.load(weights + token * TOP_K + pick).to(tl.float32)
            values = tl.load(rows + row * hidden + cols, mask=inside, other=0.0)
            total += values.to(tl.float32) * weight
        tl.store(
            out + token.to(tl.int64) * hidden + cols, total.to(out.dtype.element_ty), mask=inside
        )

    return combine
