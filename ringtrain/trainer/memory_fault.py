"""A rank that runs out of memory says so in one line: where, how full, what sizes it, the fix.

torch's own message ("CUDA out of memory. Tried to allocate 2.00 GiB ..." on a GPU, the CPU
allocator's "can't allocate memory" on a host) names the allocation, not the settings
behind it, and the rank's failure line would carry it whole. `out_of_memory_message`
replaces it with what a user acts on: the device and how full it is (free memory, what
torch holds in this process, how many ranks of the node share the GPU), the settings a
rank of this role needs memory for, and which of them a resume keeps (the batch sequence
depends on data.token_budget, so lowering it means a fresh start: --resume refuses a
changed sequence).
"""

from __future__ import annotations

import re

import torch

from ringtrain.config import Config
from ringtrain.trainer.roles import RankInfo

GIB = 2**30
# What the CPU allocator's failures say (torch raises a plain RuntimeError there).
HOST_ALLOCATOR_FAILURES = ("DefaultCPUAllocator: can't allocate memory", "not enough memory")
# The size torch tried to allocate, as its message gives it.
ATTEMPT = re.compile(r"[Tt]ried to allocate ([0-9.]+ ?[KMGT]?i?B|\d+ bytes)")


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether `exc` is an allocation that failed for want of device or host memory."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and any(s in str(exc) for s in HOST_ALLOCATOR_FAILURES)


def _device_state(device: torch.device, sharing: int) -> str:
    """Where the rank ran out (`sharing` ranks of the node on that GPU), and how full that
    is, in words."""
    if device.type != "cuda":
        return "in host memory"
    free, total = torch.cuda.mem_get_info(device)
    held = torch.cuda.memory_reserved(device)
    shared = f"; {sharing} ranks of this node run on it" if sharing > 1 else ""
    return (
        f"on GPU {device} ({free / GIB:.1f} of {total / GIB:.1f} GiB free, "
        f"{held / GIB:.1f} GiB held by torch in this process{shared})"
    )


def _settings(info: RankInfo, config: Config) -> tuple[str, str, str]:
    """(the settings this role's memory scales with, what to lower that a resume keeps,
    what to change that starts the batch sequence afresh)."""
    budget = f"data.token_budget = {config.data.token_budget} (tokens a batch)"
    fresh = "lower data.token_budget"
    if info.is_target:
        return (
            f"{budget}, the target's size and target.dtype = {config.target.dtype!r}, and "
            f"ring.slots_per_producer = {config.ring.slots_per_producer} (batches a target "
            "keeps in the ring)",
            "ring.slots_per_producer",
            f"{fresh} or split the target over more GPUs (layout.target_tp)",
        )
    drafter = config.drafter
    return (
        f"{budget}, drafter.num_anchors = {drafter.num_anchors} (blocks per "
        f"{drafter.anchor_ref_len} tokens) and drafter.loss_chunk = {drafter.loss_chunk} "
        "(rows of logits formed at once)",
        "drafter.loss_chunk or drafter.num_anchors",
        fresh,
    )


def out_of_memory_message(exc: BaseException, info: RankInfo, config: Config) -> str:
    """The rank's failure line for an out-of-memory error (see the module docstring)."""
    attempt = ATTEMPT.search(str(exc))
    tried = f" allocating {attempt.group(1)}" if attempt else ""
    sized_by, resumable, fresh = _settings(info, config)
    device = info.device
    sharing = info.local_gpus.count(device.index) if device.type == "cuda" else 1
    own_gpu = ", or give it a GPU of its own (layout.gpu_map)" if sharing > 1 else ""
    return (
        f"{info.tag} ran out of memory{tried} {_device_state(device, sharing)}. Its memory "
        "scales with "
        f"{sized_by}. Lower {resumable} (--resume goes on from the last checkpoint){own_gpu}; "
        f"or {fresh}, which changes the batch sequence: a fresh start (--resume refuses it)"
    )
