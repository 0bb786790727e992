"""The process groups of a run (ringtrain/trainer/groups.py): which groups every rank
creates, in which order and on which backend, and which of them each rank keeps.

torch.distributed needs every rank to create every group in the same order, so the
layout's ranks are walked one by one here (torchrun's environment, CUDA's device count
stood in) with the creation of a group recorded, not performed: the groups of GPU runs
(NCCL) cannot be created on this machine. A world of this one process (gloo) checks
that closing the groups destroys them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from ringtrain.config import LayoutConfig
from ringtrain.trainer.groups import RankGroups, close_groups, gloo_only, new_groups
from ringtrain.trainer.logs import get_logger
from ringtrain.trainer.roles import rank_info_from_env
from tests.helpers.launcher import as_torchrun_rank

SHARED_GPU_NOTE = "drafter ranks share a GPU"


@dataclass(frozen=True)
class Made:
    """A group as the stand-in of dist.new_group records its creation."""

    ranks: tuple[int, ...]
    backend: str


@dataclass
class RankView:
    """One rank's walk through new_groups: the groups it created, in order, what it kept,
    and the lines it logged."""

    role: str
    made: list[Made]
    groups: RankGroups
    lines: list[str]


class Lines(logging.Handler):
    """The messages logged to the project's logger while it is attached."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.fixture
def lines() -> Iterator[Lines]:
    logger, handler = get_logger(), Lines()
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


def every_rank(
    monkeypatch: pytest.MonkeyPatch, lines: Lines, layout: LayoutConfig, gpus: int
) -> list[RankView]:
    """new_groups on each rank of one node of `layout` on a machine of `gpus` GPUs."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    made: list[Made] = []

    def new_group(ranks: list[int], backend: str) -> Made:
        made.append(Made(tuple(ranks), backend))
        return made[-1]

    monkeypatch.setattr(dist, "new_group", new_group)
    world = layout.targets_per_node + layout.drafters_per_node
    views = []
    for rank in range(world):
        as_torchrun_rank(monkeypatch, rank, rank, world, world)
        info = rank_info_from_env(layout, "auto")
        made.clear()
        lines.lines.clear()
        groups = new_groups(info)
        views.append(RankView(info.role, list(made), groups, list(lines.lines)))
    return views


GROUPED = LayoutConfig(targets_per_node=4, drafters_per_node=2, target_tp=2)


def test_on_cpu_every_group_is_gloo_and_each_target_keeps_its_own(
    monkeypatch: pytest.MonkeyPatch, lines: Lines
) -> None:
    views = every_rank(monkeypatch, lines, GROUPED, gpus=0)
    drafters, first, second = Made((4, 5), "gloo"), Made((0, 1), "gloo"), Made((2, 3), "gloo")
    for view in views:
        assert view.made == [drafters, first, second]  # every rank, in the same order
    kept = [view.groups for view in views]
    assert kept[:4] == [RankGroups(None, group, group) for group in (first, first, second, second)]
    assert kept[4:] == [RankGroups(drafters, None, None)] * 2
    assert not any(view.lines for view in views)


def test_on_gpus_a_target_group_computes_on_nccl_and_decides_on_gloo(
    monkeypatch: pytest.MonkeyPatch, lines: Lines
) -> None:
    views = every_rank(monkeypatch, lines, GROUPED, gpus=8)
    nccl = [Made((4, 5), "nccl"), Made((0, 1), "nccl"), Made((2, 3), "nccl")]
    gloo = [Made((0, 1), "gloo"), Made((2, 3), "gloo")]
    for view in views:
        assert view.made == [nccl[0], nccl[1], gloo[0], nccl[2], gloo[1]]
    kept = [view.groups for view in views]
    assert kept[1] == RankGroups(None, nccl[1], gloo[0])
    assert kept[2] == RankGroups(None, nccl[2], gloo[1])
    assert kept[5] == RankGroups(nccl[0], None, None)
    monkeypatch.setattr(dist, "get_backend", lambda group: group.backend)
    assert not any(gloo_only(groups) for groups in kept)  # NCCL's are left to the exit


def test_drafters_sharing_a_gpu_reduce_on_gloo_and_each_says_so(
    monkeypatch: pytest.MonkeyPatch, lines: Lines
) -> None:
    layout = LayoutConfig(targets_per_node=1, drafters_per_node=2)  # all on cuda:0
    views = every_rank(monkeypatch, lines, layout, gpus=1)
    shared = Made((1, 2), "gloo")
    for view in views:
        assert view.made == [shared]
    assert [view.groups.drafters for view in views] == [None, shared, shared]
    said = [sum(SHARED_GPU_NOTE in line for line in view.lines) for view in views]
    assert said == [0, 1, 1]  # in the drafters' logs, once each
    monkeypatch.setattr(dist, "get_backend", lambda group: group.backend)
    assert all(gloo_only(view.groups) for view in views)


@pytest.mark.parametrize("gpus", [0, 3])
@pytest.mark.parametrize("targets", [1, 2])
def test_a_lone_drafter_and_ungrouped_targets_create_no_groups(
    monkeypatch: pytest.MonkeyPatch, lines: Lines, gpus: int, targets: int
) -> None:
    layout = LayoutConfig(targets_per_node=targets, drafters_per_node=1)
    for view in every_rank(monkeypatch, lines, layout, gpus):
        assert view.made == []
        assert view.groups == RankGroups()


def test_closing_the_groups_destroys_them(tmp_path: Path) -> None:
    close_groups()  # nothing to close before the world exists
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        group = dist.new_group([0])
        assert gloo_only(RankGroups(group, group, group))
        close_groups()
        assert not dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
