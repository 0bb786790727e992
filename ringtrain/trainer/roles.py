"""Rank roles from the torchrun environment and the [layout] config.

On every node, local ranks 0..T-1 are targets (producers into the node's ring) and local
ranks T..T+D-1 are drafters (consumers): END_OF_ROLE gives the end of the ring, which
knows nothing of targets and drafters, of each role (the ring repeats the roles as its
ranks' labels). Role indices are global: target i of node n is
target n*T + i, likewise for drafters, so data sharding and gradient groups span nodes.

With `[layout] target_tp = k`, consecutive target ranks of a node form groups of k that
run one target with tensor parallelism: target i is member i % k of group i // k (global
over nodes, since k divides T a group never spans nodes). A group is one producer on the
ring: its data stream, cursor and evaluation shard are keyed by the group index, and its
member 0 (the lead) is the one that takes and publishes slots.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

import torch

from ringtrain.config import ConfigError, LayoutConfig
from ringtrain.monitor.advice import saturation_rate
from ringtrain.ring.spec import CONSUMER, PRODUCER

TARGET = "target"
DRAFTER = "drafter"
# The end of the node's ring each role sits at.
END_OF_ROLE = {TARGET: PRODUCER, DRAFTER: CONSUMER}


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
    target_tp: int = 1  # target ranks per tensor-parallel target group
    local_gpus: tuple[int, ...] = ()  # the GPU of each local rank, targets first (none on CPU)

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
    def local_drafter_gpus(self) -> tuple[int, ...]:
        """The GPU of each drafter rank of this node (empty on CPU)."""
        return self.local_gpus[self.targets_per_node :]

    @property
    def producer_count(self) -> int:
        """Producers on all rings: target groups over all nodes (target ranks when k = 1)."""
        return self.num_nodes * self.targets_per_node // self.target_tp

    @property
    def group_index(self) -> int:
        """A target rank's group, global over nodes: its producer index."""
        return self.role_index // self.target_tp

    @property
    def group_member(self) -> int:
        """A target rank's place in its group (0: the lead, which publishes the slots)."""
        return self.role_index % self.target_tp

    @property
    def group_ranks(self) -> list[int]:
        """Global ranks of this target rank's group, lead first."""
        first = self.rank - self.group_member
        return list(range(first, first + self.target_tp))

    @property
    def target_groups(self) -> list[list[int]]:
        """Global ranks of every target group, node by node (the same list on every rank)."""
        return [
            [node * self.local_world_size + local for local in group]
            for node in range(self.num_nodes)
            for group in local_target_groups(self.targets_per_node, self.target_tp)
        ]

    @property
    def tag(self) -> str:
        return f"rank{self.rank}-{self.role}{self.role_index}"


def local_role(local_rank: int, targets_per_node: int) -> str:
    """The role of a local rank: the node's first `targets_per_node` ranks are targets."""
    return TARGET if local_rank < targets_per_node else DRAFTER


def local_target_groups(targets_per_node: int, target_tp: int) -> list[list[int]]:
    """The local ranks of each target group of a node: `target_tp` consecutive target ranks."""
    return [
        list(range(first, first + target_tp)) for first in range(0, targets_per_node, target_tp)
    ]


def gpu_residents(layout: LayoutConfig) -> list[tuple[int, int]]:
    """Per GPU that `layout.gpu_map` names, in index order: how many target groups have a
    rank on it and how many drafters it holds (what advice.saturation_rate weighs).

    The map gives one GPU per local rank, targets first (check_gpu_map)."""
    check_gpu_map(layout)
    groups = [
        {layout.gpu_map[rank] for rank in group}
        for group in local_target_groups(layout.targets_per_node, layout.target_tp)
    ]
    drafter_gpus = layout.gpu_map[layout.targets_per_node :]
    return [
        (sum(gpu in group for group in groups), drafter_gpus.count(gpu))
        for gpu in sorted(set(layout.gpu_map))
    ]


def layout_rate(layout: LayoutConfig, target_rate: float, drafter_rate: float) -> float:
    """The node rate at which the busiest GPU of `layout` (its gpu_map) saturates, from one
    target group's standalone rate and one drafter's (advice.saturation_rate)."""
    producers = layout.targets_per_node // layout.target_tp
    return saturation_rate(
        target_rate, drafter_rate, producers, layout.drafters_per_node, gpu_residents(layout)
    )


def check_gpu_map(layout: LayoutConfig) -> None:
    """Refuse a `layout.gpu_map` that does not name one GPU per local rank."""
    ranks = layout.targets_per_node + layout.drafters_per_node
    if len(layout.gpu_map) != ranks:
        raise ConfigError(
            f"layout.gpu_map {list(layout.gpu_map)} names {len(layout.gpu_map)} GPUs: give one "
            f"GPU per rank ({ranks} ranks, targets first)"
        )


def check_layout(layout: LayoutConfig) -> None:
    """Refuse a [layout] without a target and a drafter per node, or whose target_tp does
    not divide targets_per_node."""
    if layout.targets_per_node < 1 or layout.drafters_per_node < 1:
        raise ConfigError("[layout] needs at least one target and one drafter per node")
    if layout.targets_per_node % layout.target_tp:
        raise ConfigError(
            f"[layout] target_tp = {layout.target_tp} does not divide targets_per_node = "
            f"{layout.targets_per_node}: a target group is target_tp consecutive target ranks "
            "of one node; make targets_per_node a multiple of target_tp"
        )


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
    check_layout(layout)
    if local_world_size != per_node:
        raise ConfigError(
            f"[layout] asks for {layout.targets_per_node} target(s) + "
            f"{layout.drafters_per_node} drafter(s) = {per_node} processes per node, but "
            f"torchrun started {local_world_size}: use --nproc-per-node {per_node} or "
            "change [layout]"
        )
    num_nodes = world_size // local_world_size
    node_rank = rank // local_world_size
    role = local_role(local_rank, layout.targets_per_node)
    if role == TARGET:
        role_index = node_rank * layout.targets_per_node + local_rank
        role_count = num_nodes * layout.targets_per_node
    else:
        role_index = node_rank * layout.drafters_per_node + local_rank - layout.targets_per_node
        role_count = num_nodes * layout.drafters_per_node
    device = choose_device(local_rank, layout, device_preference)
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
        device=device,
        target_tp=layout.target_tp,
        local_gpus=tuple(
            choose_device(local, layout, device_preference).index for local in range(per_node)
        )
        if device.type == "cuda"
        else (),
    )
