"""Rank roles from the torchrun environment and the [layout] config.

On every node, local ranks 0..T-1 are targets (producers into the node's ring) and local
ranks T..T+D-1 are drafters (consumers). Role indices are global: target i of node n is
target n*T + i, likewise for drafters, so data sharding and gradient groups span nodes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

import torch

from ringtrain.config import ConfigError, LayoutConfig

TARGET = "target"
DRAFTER = "drafter"


@dataclass(frozen=True)
class RankInfo:
    """Where this process sits: its ranks, role and device."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    num_nodes: int
    restart_count: int
    role: str
    role_index: int  # global index among the ranks of this role
    role_count: int  # ranks of this role over all nodes
    targets_per_node: int
    drafters_per_node: int
    device: torch.device

    @property
    def is_target(self) -> bool:
        return self.role == TARGET

    @property
    def is_lead_drafter(self) -> bool:
        """The first drafter rank: it logs progress, writes metrics and checkpoints."""
        return self.role == DRAFTER and self.role_index == 0

    @property
    def drafter_ranks(self) -> list[int]:
        """Global ranks of all drafters, node by node."""
        per_node = self.local_world_size
        return [
            node * per_node + self.targets_per_node + i
            for node in range(self.num_nodes)
            for i in range(self.drafters_per_node)
        ]

    @property
    def tag(self) -> str:
        return f"rank{self.rank}-{self.role}{self.role_index}"


def _env_int(name: str) -> int:
    value = os.environ.get(name)
    if value is None:
        raise ConfigError(
            f"environment variable {name} is not set: start ringtrain through torchrun, "
            "e.g. `torchrun --standalone --nproc-per-node 3 -m ringtrain.main`"
        )
    return int(value)


def choose_device(
    local_rank: int, layout: LayoutConfig, preference: Literal["auto", "cuda", "cpu"]
) -> torch.device:
    """The device of a local rank: CUDA when present (GPU map or round robin), else CPU."""
    if preference == "cpu" or (preference == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError('run.device = "cuda" but CUDA is not available; use "auto" or "cpu"')
    count = torch.cuda.device_count()
    if layout.gpu_map:
        if local_rank >= len(layout.gpu_map):
            raise ConfigError(
                f"layout.gpu_map has {len(layout.gpu_map)} entries but local rank "
                f"{local_rank} exists: give one GPU index per local rank"
            )
        index = layout.gpu_map[local_rank]
        if not 0 <= index < count:
            raise ConfigError(
                f"layout.gpu_map[{local_rank}] = {index} but this node has {count} GPU(s)"
            )
        return torch.device("cuda", index)
    return torch.device("cuda", local_rank % count)


def rank_info_from_env(
    layout: LayoutConfig, device_preference: Literal["auto", "cuda", "cpu"]
) -> RankInfo:
    """Read torchrun's variables, check them against [layout], and assign this rank's role."""
    rank = _env_int("RANK")
    world_size = _env_int("WORLD_SIZE")
    local_rank = _env_int("LOCAL_RANK")
    local_world_size = _env_int("LOCAL_WORLD_SIZE")
    per_node = layout.targets_per_node + layout.drafters_per_node
    if layout.targets_per_node < 1 or layout.drafters_per_node < 1:
        raise ConfigError("[layout] needs at least one target and one drafter per node")
    if local_world_size != per_node:
        raise ConfigError(
            f"[layout] asks for {layout.targets_per_node} target(s) + "
            f"{layout.drafters_per_node} drafter(s) = {per_node} processes per node, but "
            f"torchrun started {local_world_size}: use --nproc-per-node {per_node} or "
            "change [layout]"
        )
    num_nodes = world_size // local_world_size
    node_rank = rank // local_world_size
    if local_rank < layout.targets_per_node:
        role, role_index = TARGET, node_rank * layout.targets_per_node + local_rank
        role_count = num_nodes * layout.targets_per_node
    else:
        role = DRAFTER
        role_index = node_rank * layout.drafters_per_node + local_rank - layout.targets_per_node
        role_count = num_nodes * layout.drafters_per_node
    return RankInfo(
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        local_world_size=local_world_size,
        node_rank=node_rank,
        num_nodes=num_nodes,
        restart_count=int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
        role=role,
        role_index=role_index,
        role_count=role_count,
        targets_per_node=layout.targets_per_node,
        drafters_per_node=layout.drafters_per_node,
        device=choose_device(local_rank, layout, device_preference),
    )
