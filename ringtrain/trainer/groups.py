"""The process groups of a run besides the world: the drafters' and the target groups'.

torch.distributed requires every rank to create every group, in the same order, so
each rank walks the same list and keeps the groups it belongs to. Drafters reduce
gradients in theirs (NCCL on CUDA, gloo on CPU). A target group (`[layout] target_tp`
> 1) gets two: its tensor-parallel group, on the device's backend, for the collectives
of the split forward, and a gloo group for the lead's small per-iteration decision
(trainer/target_group.py), which a member then waits for on the CPU: a broadcast of
NCCL would spin on the member's GPU for as long as the lead waits for a free slot.
On CPU both are one gloo group.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist

from ringtrain.trainer.roles import DRAFTER, TARGET, RankInfo


@dataclass(frozen=True)
class RankGroups:
    """The groups this rank belongs to (None: it has none of that kind)."""

    drafters: dist.ProcessGroup | None = None  # gradient reduction (more than one drafter)
    target: dist.ProcessGroup | None = None  # the target group's split forward
    target_control: dist.ProcessGroup | None = None  # the lead's decisions (gloo)


def new_groups(info: RankInfo) -> RankGroups:
    """Create every group of the run (call on every rank after init_process_group)."""
    backend = "nccl" if info.device.type == "cuda" else "gloo"
    ranks = info.drafter_ranks
    drafters = dist.new_group(ranks=ranks, backend=backend) if len(ranks) > 1 else None
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
