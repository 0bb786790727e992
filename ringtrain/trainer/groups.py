"""The process groups of a run besides the world: the drafters' and the target groups'.

torch.distributed requires every rank to create every group, in the same order, so
each rank walks the same list and keeps the groups it belongs to. Drafters reduce
gradients in theirs: NCCL on CUDA, gloo on CPU, and gloo too where two drafter ranks of
a node share a GPU (NCCL refuses two ranks of one communicator on one device; gloo
reduces CUDA tensors through host memory, slower but correct), said in one log line.
A target group (`[layout] target_tp`
> 1) gets two: its tensor-parallel group, on the device's backend, for the collectives
of the split forward, and a gloo group for the lead's small per-iteration decision
(trainer/target_group.py), which a member then waits for on the CPU: a broadcast of
NCCL would spin on the member's GPU for as long as the lead waits for a free slot.
On CPU both are one gloo group.
"""

from __future__ import annotations

import gc
from collections import Counter
from dataclasses import dataclass

import torch.distributed as dist

from ringtrain.trainer.logs import get_logger
from ringtrain.trainer.roles import DRAFTER, TARGET, RankInfo


@dataclass(frozen=True)
class RankGroups:
    """The groups this rank belongs to (None: it has none of that kind)."""

    drafters: dist.ProcessGroup | None = None  # gradient reduction (more than one drafter)
    target: dist.ProcessGroup | None = None  # the target group's split forward
    target_control: dist.ProcessGroup | None = None  # the lead's decisions (gloo)


@dataclass(frozen=True)
class DrafterBackend:
    """The drafter group's backend, and why it is not NCCL on a GPU (None: it is, or CPU)."""

    name: str
    note: str | None = None


def drafter_backend(info: RankInfo) -> DrafterBackend:
    """NCCL for drafters on distinct GPUs; gloo on CPU or where drafters share a GPU."""
    if info.device.type != "cuda":
        return DrafterBackend("gloo")
    shared = {gpu: n for gpu, n in Counter(info.local_drafter_gpus).items() if n > 1}
    if not shared:
        return DrafterBackend("nccl")
    where = ", ".join(f"{n} on cuda:{gpu}" for gpu, n in sorted(shared.items()))
    return DrafterBackend(
        "gloo",
        f"drafter ranks share a GPU ({where}): NCCL allows one rank per GPU in a group, so "
        "the drafters reduce gradients with gloo through host memory (slower for large "
        "drafters; a layout.gpu_map with one drafter per GPU uses NCCL)",
    )


def new_groups(info: RankInfo) -> RankGroups:
    """Create every group of the run (call on every rank after init_process_group)."""
    backend = "nccl" if info.device.type == "cuda" else "gloo"
    ranks = info.drafter_ranks
    drafters = None
    if len(ranks) > 1:
        choice = drafter_backend(info)
        drafters = dist.new_group(ranks=ranks, backend=choice.name)
        if choice.note and info.role == DRAFTER:
            get_logger().info("%s", choice.note)
    target = control = None
    if info.target_tp > 1:
        for members in info.target_groups:
            compute = dist.new_group(ranks=members, backend=backend)
            decide = compute if backend == "gloo" else dist.new_group(ranks=members, backend="gloo")
            if info.role == TARGET and info.rank in members:
                target, control = compute, decide
    return RankGroups(
        drafters=drafters if info.role == DRAFTER else None, target=target, target_control=control
    )


def gloo_only(groups: RankGroups) -> bool:
    """Whether every group of this rank runs gloo (the world group always does)."""
    members = (groups.drafters, groups.target, groups.target_control)
    return all(dist.get_backend(group) == "gloo" for group in members if group is not None)


def close_groups() -> None:
    """Destroy this rank's process groups now, while the interpreter is whole (call after
    the rank's last collective, on a clean finish, where `gloo_only`).

    Gloo runs each collective on its own worker threads, and such a thread can still hold
    the last reference to a finished operation when the rank returns. Left to interpreter
    shutdown, those threads and the groups' destructors run while Python tears itself
    down, and a thread that then needs the interpreter aborts the process ("terminate
    called without an active exception", exit -6) after a run that succeeded. The
    modules that hold a group (DDP) are collected first, so destroying the groups frees
    them and joins their threads here. NCCL groups are left to the process's exit as
    before: a communicator destroyed while a peer may still read this rank's buffers of
    the last collective needs a barrier first, which a rank that stopped alone would
    never reach."""
    gc.collect()
    if dist.is_initialized():
        dist.destroy_process_group()
