"""A tensor-parallel target group of two (gloo, two real processes) taps what one rank taps.

Tiny dense (qwen3) and mixture-of-experts (qwen3_moe, gpt_oss) targets written with
``save_pretrained`` are loaded by both members of a group; each member's taps of a
right-padded batch of two sequences must equal a single-process load's taps to 1e-4
(float32), each member must hold half of every attention, MLP and expert weight, and
targets the group cannot split (hybrid Gated DeltaNet, multi-head latent attention, head
counts the group size does not divide) must be refused with the fix.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist

from ringtrain.target.loader import load_target
from ringtrain.target.model_dir import TargetLoadError
from ringtrain.target.runner import TargetRunner
from ringtrain.target.tapped import TappedTarget
from tests.helpers.launcher import run_gloo_pair
from tests.helpers.tiny_families import (
    LAYERS,
    SEQUENCE_LENGTHS,
    VOCAB,
    Padded,
    build_model,
    write_model,
)

SPLIT_FAMILIES = ("qwen3", "qwen3_moe", "gpt_oss")
# config-only targets a group of two must refuse -> what the refusal names
REFUSED = {
    "qwen3_next": "hybrid Gated DeltaNet.*target_tp = 1 for this family",
    "deepseek_v3": "multi-head latent attention.*target_tp = 1 for this family",
    "minimax_m2": "normalises all heads together.*target_tp = 1 for this family",
    "qwen3_one_kv_head": r"\(4 query heads, 1 key/value heads\).*divides 1",
}
TAPS = [1, 3, LAYERS - 1]


def write_refused(directory: Path) -> None:
    """Config-only directories of the targets in REFUSED."""
    for name in REFUSED:
        family = "qwen3" if name.startswith("qwen3_one") else name
        model = build_model(family)
        if family == "qwen3":
            model.config.num_key_value_heads = 1
        model.config.save_pretrained(directory / name)


def taps_of(target: TappedTarget) -> torch.Tensor:
    """The packed taps of the test batch."""
    rng = np.random.default_rng(0)
    runner = TargetRunner(target)
    rows = runner.prefetch(Padded([rng.integers(1, VOCAB, size=n) for n in SEQUENCE_LENGTHS]))
    out = torch.full((rows, target.tap_width), float("nan"))
    runner.forward_into(out)
    return out


def local_shapes(target: TappedTarget) -> dict[str, list[int]]:
    """Every layer parameter's shape as this member holds it."""
    return {
        name: list(getattr(param, "_local_tensor", param).shape)
        for name, param in target.module.layers.named_parameters()
    }


def group_worker(rank: int, store: str, out: str) -> None:
    """Member ``rank`` of a group of two: taps and shard shapes of each SPLIT_FAMILIES
    target, and the refusals, saved to ``out``/rank.pt."""
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    group = dist.new_group([0, 1])
    results: dict = {}
    for family in SPLIT_FAMILIES:
        target = load_target(
            Path(out, family), tap_layers=TAPS, device="cpu", dtype="float32", group=group
        )
        results[family] = {"taps": taps_of(target), "shapes": local_shapes(target)}
    for name in REFUSED:
        try:
            load_target(Path(out, name), tap_layers=TAPS, random_weights=True, group=group)
            results[name] = "loaded"
        except TargetLoadError as error:
            results[name] = str(error)
    torch.save(results, Path(out) / f"{rank}.pt")


def assert_halved(family: str, got: dict[str, list[int]], whole: dict[str, list[int]]) -> None:
    """Every attention, MLP and expert weight (and per-head vector) a member holds is half
    of the whole; what it holds whole are norms, the router and row-parallel biases."""
    halves = {name for name, shape in got.items() if shape != whole[name]}
    for name in halves:
        assert np.prod(got[name]) * 2 == np.prod(whole[name]), (family, name, got[name])
    split = {n for n in whole if n.endswith(("proj.weight", "_proj", "sinks"))}
    assert halves >= split, (family, sorted(split - halves))
    replicated = set(whole) - halves
    kept_whole = ("norm.weight", "router.weight", "router.bias", "gate.weight", "bias")
    assert all(name.endswith(kept_whole) for name in replicated), (family, sorted(replicated))


@pytest.mark.slow
def test_group_of_two_taps_what_one_rank_taps(tmp_path: Path) -> None:
    for family in SPLIT_FAMILIES:
        write_model(tmp_path / family, build_model(family))
    write_refused(tmp_path)
    members = run_gloo_pair(group_worker, tmp_path)
    for family in SPLIT_FAMILIES:
        alone = load_target(tmp_path / family, tap_layers=TAPS, device="cpu", dtype="float32")
        want, whole = taps_of(alone), local_shapes(alone)
        for rank, member in enumerate(members):
            torch.testing.assert_close(
                member[family]["taps"],
                want,
                atol=1e-4,
                rtol=0,
                msg=lambda m, where=f"{family}, member {rank}": f"{where}: {m}",
            )
            assert_halved(family, member[family]["shapes"], whole)
    for name, message in REFUSED.items():
        for member in members:
            assert re.search(message, member[name]), (name, member[name])
