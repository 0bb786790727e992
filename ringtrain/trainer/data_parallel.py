"""The drafters' data parallelism: PyTorch's DistributedDataParallel over the drafter group.

DDP reduces the gradients in buckets while backward still runs, so the reduction hides
behind the backward of the layers before it. The gradients are views into DDP's buckets
(no second copy of 4 bytes per parameter), and buffers are never synchronised in
forward: the drafter's only buffer (RoPE frequencies) is the same on every rank, and a
forward with a collective would deadlock the held-out evaluations, which ranks run in
different numbers. With `grad_reduce_dtype = "bfloat16"` the buckets travel in bf16
(DDP's bf16 compression hook) and are restored to fp32 before the optimizer sees them.
Drafters that share a GPU reduce through a gloo group (trainer/groups.py), which has no
bf16 compression to gain from: there "bfloat16" falls back to fp32 with one log line.
With "float64" they travel in fp64 (`float64_reduce_hook`): a sum of a few fp32 values is
then exact, or rounded once, so it no longer depends on the order in which the ranks'
gradients are added, which follows which drafter took which batch; the fp32 result is the
same in every run. Muon, whose orthogonalised step turns a last-bit difference of a
gradient into one of a step's size, needs this for runs of several drafters to repeat
(and to resume) weight for weight.

On CUDA the objective compiles the DDP-wrapped module (DDP first, then torch.compile:
the combination PyTorch documents for DDP, where Dynamo's DDPOptimizer splits the
graph at bucket boundaries so each bucket's reduction starts as soon as its backward
piece ends). DDP rather than FSDP2: a drafter (about 1.2 B parameters for Qwen3-8B)
and its AdamW state fit one GPU with room to spare, so sharding would only add a
gather of the weights to every forward and backward.

DDP averages over ranks; the loop scales each rank's loss by ranks / global weight sum,
so the averaged gradient is the sum of every rank's gradient over the global weight
sum: exactly the loss normalised by the global count of supervised labels.

`GradSyncProbe` reads DDP's own timings of the sampled iterations (the first ten, then
one in a hundred): how long the reduction ran, and how much of it backward did not hide.
"""

from __future__ import annotations

import inspect
import typing

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from ringtrain.trainer.logs import get_logger

NANOSECONDS_PER_MS = 1e6


def _no_forward_buffer_sync() -> dict[str, bool]:
    """DDP's keyword that turns off the buffer broadcast in forward, in this torch."""
    parameters = inspect.signature(DistributedDataParallel.__init__).parameters
    if "forward_sync_buffers" in parameters:
        return {"forward_sync_buffers": False}
    return {"broadcast_buffers": False}


def float64_reduce_hook(
    group: dist.ProcessGroup, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook: the bucket's mean over `group`, summed in fp64, written back in the
    bucket's own dtype."""
    buffer = bucket.buffer()
    wide = buffer.to(torch.float64).div_(dist.get_world_size(group))
    reduced = dist.all_reduce(wide, group=group, async_op=True).get_future()

    def write_back(future: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
        buffer.copy_(future.value()[0])
        return buffer

    return reduced.then(write_back)


# DDP checks a hook's annotations as objects; this module's are strings until resolved.
float64_reduce_hook.__annotations__ = typing.get_type_hints(float64_reduce_hook)


def wrap_data_parallel(
    model: nn.Module, group: dist.ProcessGroup | None, grad_reduce_dtype: str
) -> nn.Module:
    """`model` in DDP over `group` (rank 0's weights copied to every rank), or `model`
    itself when it trains alone (no group)."""
    if group is None:
        return model
    device = next(model.parameters()).device
    if grad_reduce_dtype == "bfloat16" and device.type != "cuda":
        raise ValueError(
            'optim.grad_reduce_dtype = "bfloat16" needs drafters on CUDA (NCCL reduces '
            'bf16; gloo does not): set it to "float32" for a run on CPU'
        )
    if grad_reduce_dtype == "bfloat16" and dist.get_backend(group) != "nccl":
        get_logger().info(
            'optim.grad_reduce_dtype = "bfloat16" compresses NCCL\'s reduction; the drafters '
            "share a GPU and reduce with gloo, so they reduce in float32"
        )
        grad_reduce_dtype = "float32"
    network = DistributedDataParallel(
        model,
        device_ids=[device] if device.type == "cuda" else None,
        process_group=group,
        gradient_as_bucket_view=True,
        **_no_forward_buffer_sync(),
    )
    if grad_reduce_dtype == "bfloat16":
        network.register_comm_hook(group, default_hooks.bf16_compress_hook)
    elif grad_reduce_dtype == "float64":
        network.register_comm_hook(group, float64_reduce_hook)
    return network


def data_parallel_ranks(group: dist.ProcessGroup | None) -> int:
    """How many drafters average their gradients (1 alone)."""
    return 1 if group is None else dist.get_world_size(group)


class GradSyncProbe:
    """DDP's timings of the gradient reduction, read once per sampled iteration."""

    def __init__(self, network: nn.Module) -> None:
        self.network = network if isinstance(network, DistributedDataParallel) else None
        self._last_iteration = -1

    def sample(self) -> tuple[float, float] | None:
        """(reduction ms, ms of it not overlapped with backward) of the latest sampled
        iteration, once per iteration; None between samples and without DDP."""
        if self.network is None:
            return None
        data = self.network._get_ddp_logging_data()
        iteration = int(data.get("iteration", -1))
        if "backward_comm_time" not in data or iteration == self._last_iteration:
            return None
        self._last_iteration = iteration
        comm = data["backward_comm_time"] / NANOSECONDS_PER_MS
        overlapped = data.get("backward_compute_comm_overlap_time", 0) / NANOSECONDS_PER_MS
        return comm, max(0.0, comm - overlapped)


def scaled_loss(loss_sum: torch.Tensor, ranks: int, global_weight_sum: float) -> torch.Tensor:
    """The loss whose rank-averaged gradient is the global sum of gradients over the
    global weight sum (see the module docstring)."""
    return loss_sum * (ranks / max(global_weight_sum, 1e-12))
