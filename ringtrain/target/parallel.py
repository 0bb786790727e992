"""Tensor parallelism of a truncated target over a target group (PyTorch's DTensor engine).

A group of k ranks runs ONE target: every member holds 1/k of each decoder layer's
attention and MLP weights and computes with them; the residual stream (embedding output,
every layer's output, hence every tap) is replicated, so every member writes identical
taps. Per decoder layer:

- attention: ``q_proj``, ``k_proj``, ``v_proj`` column-parallel (each member holds whole
  query and key/value heads: k must divide both head counts), ``o_proj`` row-parallel, its
  partial sums all-reduced. The models reshape projections to ``(..., -1, head_dim)``, so
  they run on the local heads unchanged; per-head parameters (gpt-oss attention sinks)
  are split with the heads.
- dense MLP (and the shared experts of a mixture-of-experts block): ``gate_proj`` and
  ``up_proj`` column-parallel, ``down_proj`` row-parallel, all-reduced.
- routed experts (fused stacks ``gate_up_proj`` / ``down_proj`` of transformers 5): every
  expert's intermediate dimension is split, gate and up rows of the same intermediate
  units staying together on one member (stacked ``[gate; up]`` or interleaved), and the
  block's output, a partial sum over the members' intermediate units, is all-reduced.
  The router stays replicated, so every member routes every token alike; an expert's
  output bias is added by the first member only.
- norms, the embedding and the router: replicated.

Linear maps use ``torch.distributed.tensor.parallel`` (``ColwiseParallel`` /
``RowwiseParallel`` over ``DeviceMesh.from_group``); expert stacks and per-head vectors
are split by ``distribute_tensor`` and reduced by a DTensor ``Partial -> Replicate``
redistribution. Weights are split from the first member's copy (a scatter), so the
members' shards always come from one source.

Refused (``target_tp = 1`` for these families): hybrid linear-attention (Gated DeltaNet)
layers, multi-head latent attention (MLA: DeepSeek-V3 and kin), query/key norms over all
heads at once (MiniMax-M2), and any layer with weights this plan does not place.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Shard, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    parallelize_module,
)
from transformers import PretrainedConfig

from ringtrain.target.model_dir import TargetLoadError
from ringtrain.target.structure import base_model_class, is_hybrid

ATTENTION_PROJECTIONS = ("q_proj", "k_proj", "v_proj")
SHARED_EXPERTS = ("shared_expert", "shared_experts")
ROUTERS = ("gate", "router", "shared_expert_gate")
PER_HEAD_PARAMETERS = ("sinks",)


class ExpertsParallel(ParallelStyle):
    """Split every routed expert's intermediate dimension; all-reduce the block's output.

    For transformers 5's fused expert stacks: ``gate_up_proj`` [E, 2I, H] (``[E, H, 2I]``
    when transposed), gate and up rows stacked (``[gate; up]``) or interleaved (gate0,
    up0, gate1, ...); ``down_proj`` [E, H, I] (``[E, I, H]``); optional biases.
    """

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        transposed = expert_stacks_transposed(module)
        pairs = "stacked" if getattr(module, "is_concatenated", True) else "interleaved"
        gate_up_dim, down_dim = (2, 1) if transposed else (1, 2)
        local_split(module, "gate_up_proj", device_mesh, gate_up_dim, pairs)
        local_split(module, "down_proj", device_mesh, down_dim)
        if getattr(module, "gate_up_proj_bias", None) is not None:
            local_split(module, "gate_up_proj_bias", device_mesh, 1, pairs)
        bias = getattr(module, "down_proj_bias", None)
        if bias is not None and device_mesh.get_local_rank() != 0:
            bias.data.zero_()
        module.register_forward_hook(lambda _m, _args, out: all_reduce(out, device_mesh))
        return module


class PerHeadParallel(ParallelStyle):
    """Split an attention module's per-head vectors (``sinks``) with its heads."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        for name in PER_HEAD_PARAMETERS:
            if getattr(module, name, None) is not None:
                local_split(module, name, device_mesh, 0)
        return module


def expert_stacks_transposed(experts: nn.Module) -> bool:
    """Whether the expert stacks are stored [E, in, out] (gpt-oss) rather than [E, out, in]."""
    if hasattr(experts, "is_transposed"):
        return bool(experts.is_transposed)
    return experts.down_proj.shape[-1] == experts.gate_up_proj.shape[1]


def all_reduce(partial: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
    """Sum the members' partial results (DTensor ``Partial -> Replicate``)."""
    return DTensor.from_local(partial, mesh, [Partial()]).full_tensor()


def local_split(
    module: nn.Module, name: str, mesh: DeviceMesh, dim: int, pairs: str | None = None
) -> None:
    """Replace parameter ``name`` by this member's slice along ``dim``.

    ``pairs``: ``dim`` holds gate and up units, ``"stacked"`` ([gate; up]) or
    ``"interleaved"`` (gate0, up0, ...); each member gets the gate and up rows of the
    same units, in the same layout.
    """
    param = getattr(module, name).detach()
    if pairs == "stacked":
        whole, shard_dim = param.unflatten(dim, (2, -1)), dim + 1
    elif pairs == "interleaved":
        whole, shard_dim = param.unflatten(dim, (-1, 2)), dim
    else:
        whole, shard_dim = param, dim
    local = distribute_tensor(whole, mesh, [Shard(shard_dim)]).to_local()
    if pairs is not None:
        local = local.flatten(dim, dim + 1)
    setattr(module, name, nn.Parameter(local.contiguous(), requires_grad=False))


def dense_plan(prefix: str) -> dict[str, ParallelStyle]:
    """A SwiGLU MLP: gate and up column-parallel, down row-parallel."""
    return {
        f"{prefix}.gate_proj": ColwiseParallel(),
        f"{prefix}.up_proj": ColwiseParallel(),
        f"{prefix}.down_proj": RowwiseParallel(),
    }


def layer_plan(layer: nn.Module) -> dict[str, ParallelStyle]:
    """The tensor-parallel plan of one decoder layer (paths relative to the layer)."""
    plan: dict[str, ParallelStyle] = {
        f"self_attn.{p}": ColwiseParallel() for p in ATTENTION_PROJECTIONS
    }
    plan["self_attn.o_proj"] = RowwiseParallel()
    if any(getattr(layer.self_attn, p, None) is not None for p in PER_HEAD_PARAMETERS):
        plan["self_attn"] = PerHeadParallel()
    mlp = layer.mlp
    if hasattr(mlp, "experts"):
        plan["mlp.experts"] = ExpertsParallel()
        for name in SHARED_EXPERTS:
            if hasattr(mlp, name):
                plan.update(dense_plan(f"mlp.{name}"))
    else:
        plan.update(dense_plan("mlp"))
    return plan


def placed_by(plan: dict[str, ParallelStyle], name: str) -> bool:
    """Whether parameter ``name`` of a layer is split by ``plan`` or meant to be replicated
    (norm weights, the router)."""
    module_name, _, attr = name.rpartition(".")
    if isinstance(plan.get(module_name), PerHeadParallel):
        return attr in PER_HEAD_PARAMETERS
    if any(name.startswith(f"{path}.") for path in plan):
        return True
    if module_name.endswith("norm"):
        return True
    return any(module_name == f"mlp.{router}" for router in ROUTERS)


def layer_problems(layer: nn.Module, size: int) -> list[str]:
    """Why ``layer`` cannot be split over ``size`` members (empty: it can)."""
    attention = layer.self_attn
    problems = []
    head_dim = getattr(attention, "head_dim", None)
    for norm in ("q_norm", "k_norm"):
        weight = getattr(getattr(attention, norm, None), "weight", None)
        if weight is not None and weight.shape[-1] != head_dim:
            problems.append(
                f"its {norm} normalises all heads together ({weight.shape[-1]} values, "
                f"head_dim {head_dim}), which needs a reduction across the group"
            )
    experts = getattr(layer.mlp, "experts", None)
    if experts is not None:
        problems.extend(experts_problems(experts, size))
    plan = layer_plan(layer)
    unplaced = [name for name, _ in layer.named_parameters() if not placed_by(plan, name)]
    if unplaced:
        problems.append(f"it has weights the tensor-parallel plan does not place: {unplaced[:4]}")
    return problems


def experts_problems(experts: nn.Module, size: int) -> list[str]:
    """Why a block's routed experts cannot be split over ``size`` members."""
    if not isinstance(getattr(experts, "gate_up_proj", None), nn.Parameter):
        return [f"its experts ({type(experts).__name__}) are not fused gate/up and down stacks"]
    if getattr(experts, "has_post_expert_norm", False):
        return ["its experts normalise their outputs, which needs the whole intermediate"]
    down = experts.down_proj
    inner = down.shape[1] if expert_stacks_transposed(experts) else down.shape[2]
    if inner % size:
        return [f"the experts' intermediate size {inner} is not divisible by {size}"]
    return []


def check_tensor_parallel(config: PretrainedConfig, size: int) -> None:
    """Raise TargetLoadError unless the (truncated) target of ``config`` can be split over
    a group of ``size`` members. Builds the model on the meta device: no memory, no
    weights read, so it runs before loading."""
    if size == 1:
        return
    name = config.model_type
    unsupported = f"target_tp = 1 for this family (model type {name!r})"
    if is_hybrid(config):
        raise TargetLoadError(
            f"a tensor-parallel target group cannot split hybrid Gated DeltaNet layers yet "
            f"(their recurrent state is per head, their kernels are not sharded here); use "
            f"{unsupported}"
        )
    if getattr(config, "kv_lora_rank", None):
        raise TargetLoadError(
            f"a tensor-parallel target group cannot split multi-head latent attention (MLA) "
            f"yet (its compressed key/value projection is shared by all heads); use "
            f"{unsupported}"
        )
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    if heads % size or kv_heads % size:
        raise TargetLoadError(
            f"target_tp = {size} does not divide the target's attention heads "
            f"({heads} query heads, {kv_heads} key/value heads): every member must hold whole "
            f"heads; use a target_tp that divides {kv_heads}"
        )
    with torch.device("meta"):
        layers = base_model_class(config)(config).layers
    for index, layer in enumerate(layers):
        problems = layer_problems(layer, size)
        if problems:
            raise TargetLoadError(
                f"a tensor-parallel target group of {size} cannot split layer {index} of this "
                f"{name} target: {'; '.join(problems)}; use {unsupported}"
            )


def shard_target(module: nn.Module, group: dist.ProcessGroup, device: torch.device) -> None:
    """Split ``module`` (a truncated HF text model, anywhere) over ``group`` and move it to
    ``device``: each layer in turn is moved whole, then split (its full weights freed),
    so the device holds at most one full layer beyond this member's shards. Every member
    calls this with the same model (collective)."""
    mesh = DeviceMesh.from_group(group, device.type)
    for name, child in module.named_children():
        if name != "layers":
            child.to(device)
    for layer in module.layers:
        layer.to(device)
        parallelize_module(layer, mesh, layer_plan(layer))
