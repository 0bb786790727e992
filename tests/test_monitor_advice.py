"""Role-split advice on synthetic rate records with a known best split, and the rate of a
layout of targets and drafters on GPUs."""

from __future__ import annotations

import itertools

import pytest

from ringtrain.config import ConfigError, LayoutConfig
from ringtrain.monitor.advice import (
    MeasuredRates,
    advise,
    best_split,
    measured_rates,
    saturation_rate,
    split_rate,
)
from ringtrain.monitor.ring_figures import RankFigures, intervals
from ringtrain.trainer.roles import check_layout, gpu_residents, layout_rate, local_role

ROLES = ("target", "target", "drafter")


def _figures(rows: list[tuple[int, str, int, int, float, float]]) -> list[RankFigures]:
    return [RankFigures(*row) for row in rows]


def test_best_split_of_eight_gpus_is_found_and_its_arithmetic_shown() -> None:
    rates = MeasuredRates(
        targets=5,
        drafters=3,
        target_rate=43_000,
        drafter_rate=22_000,
        gpus=8,
        measured=64_000,
        colocated_rate=12_000,
    )
    best = best_split(rates)
    assert (best.targets, best.drafters) == (3, 5)
    assert best.rate == 110_000
    for targets in range(1, 8):
        assert split_rate(rates, targets, 8 - targets) <= best.rate
    text = "\n".join(advise(rates))
    assert "now  5 targets + 3 drafters: min(5 x 43.0k, 3 x 22.0k) = 66.0k tok/s" in text
    assert "(measured 64.0k)" in text
    assert "best 3 targets + 5 drafters: min(3 x 43.0k, 5 x 22.0k) = 110k tok/s" in text
    assert "1.67x now" in text  # against the current split by the same arithmetic (66k)
    assert "8 x 12.0k = 96.0k tok/s" in text
    assert text.endswith("=> 3 targets + 5 drafters would be fastest: ~110k tok/s")


def test_colocation_wins_when_its_measured_rate_is_higher() -> None:
    # 4 targets + 4 drafters at 40k and 20k tok/s on 8 GPUs; co-located 16k per GPU.
    rates = MeasuredRates(4, 4, 40_000, 20_000, 8, colocated_rate=16_000)
    text = "\n".join(advise(rates))
    assert "best 3 targets + 5 drafters" in text  # min(120k, 100k) = 100k
    assert text.endswith(
        "co-locating one target and one drafter per GPU would be fastest: ~128k tok/s"
    )


def test_current_split_already_fastest() -> None:
    rates = MeasuredRates(targets=2, drafters=6, target_rate=30.0, drafter_rate=10.0, gpus=8)
    assert (best_split(rates).targets, best_split(rates).drafters) == (2, 6)
    assert advise(rates)[-1] == "  => the current split is the fastest"


def test_rates_measured_from_ring_counters_pick_the_known_best_split() -> None:
    # Over 10 s each target makes 60 batches and is blocked 8 s: 30 batches/s while not
    # blocked; the drafter takes 100 batches and is never starved: 10 batches/s.
    before = _figures([(r, role, r, 0, 5.0, 0.0) for r, role in enumerate(ROLES)])
    items, blocked = (60, 60, 100), (8.0, 8.0, 0.0)
    after = _figures([(r, ROLES[r], r, items[r], 15.0, blocked[r]) for r in range(3)])
    rates = measured_rates(intervals(before, after), tokens_per_item=1000.0)
    assert rates is not None
    assert (rates.targets, rates.drafters, rates.gpus, rates.shared) == (2, 1, 3, False)
    assert rates.target_rate == 30_000 and rates.drafter_rate == 10_000
    assert rates.measured == 10_000 and rates.unit == "tok/s"
    # 2 + 1: min(60k, 10k) = 10k; 1 + 2: min(30k, 20k) = 20k.
    best = best_split(rates)
    assert (best.targets, best.drafters, best.rate) == (1, 2, 20_000)
    assert advise(rates)[-1] == "  => 1 target + 2 drafters would be fastest: ~20.0k tok/s"


def test_intervals_leave_out_a_restarted_rank_and_bound_the_wait_share() -> None:
    before = _figures([(0, "target", 0, 500, 100.0, 10.0), (1, "drafter", 1, 400, 100.0, 0.0)])
    # Rank 0 attached anew (up 3 s, fewer items): its counters are not comparable.
    after = _figures([(0, "target", 0, 30, 3.0, 0.5), (1, "drafter", 1, 460, 110.0, 10.02)])
    (drafter,) = intervals(before, after)
    assert (drafter.rank, drafter.items, drafter.seconds) == (1, 60, 10.0)
    # Counters read a moment apart may count a little more waiting than the interval.
    assert drafter.wait_share == 1.0 and drafter.items_per_working_s is None
    unwound = intervals(before, _figures([(0, "target", 0, 510, 110.0, 9.5)]))
    assert unwound[0].wait_share == 0.0


def test_shared_gpus_give_the_colocated_rate_and_cpu_counts_processes() -> None:
    pairs = [(0, "target", 0), (1, "drafter", 0), (2, "target", 1), (3, "drafter", 1)]
    before = _figures([(rank, role, device, 0, 0.0, 0.0) for rank, role, device in pairs])
    waited = {"target": 5.0, "drafter": 0.0}
    after = _figures([(rank, role, device, 50, 10.0, waited[role]) for rank, role, device in pairs])
    rates = measured_rates(intervals(before, after))
    assert (rates.gpus, rates.shared, rates.unit, rates.device) == (2, True, "batches/s", "GPU")
    assert rates.colocated_rate == 5.0  # 2 drafters x 5 batches/s over 2 GPUs
    text = "\n".join(advise(rates))
    assert "now  2 targets + 2 drafters sharing 2 GPUs: measured 10 batches/s" in text
    assert "2 x 5 = 10 batches/s" in text

    on_cpu = [RankFigures(f.rank, f.role, -1, f.items, f.up_s, f.waited_s) for f in after]
    cpu = measured_rates(
        intervals([RankFigures(f.rank, f.role, -1, 0, 0.0, 0.0) for f in on_cpu], on_cpu)
    )
    assert (cpu.gpus, cpu.shared, cpu.device) == (4, False, "process")
    assert "over the node's 4 processes" in advise(cpu)[0]


def test_no_advice_until_both_roles_have_worked() -> None:
    before = _figures([(0, "target", 0, 0, 1.0, 0.0), (1, "drafter", 1, 0, 1.0, 0.0)])
    after = _figures([(0, "target", 0, 4, 3.0, 0.0), (1, "drafter", 1, 0, 3.0, 2.0)])
    assert measured_rates(intervals(before, after)) is None


def test_every_split_rate_is_the_slower_side() -> None:
    rates = MeasuredRates(targets=1, drafters=1, target_rate=3.0, drafter_rate=5.0, gpus=2)
    for t, d in itertools.product(range(1, 4), repeat=2):
        assert split_rate(rates, t, d) == min(3.0 * t, 5.0 * d)


def test_saturation_rate_is_the_split_rate_with_one_rank_per_gpu_and_less_when_shared() -> None:
    rates = MeasuredRates(targets=1, drafters=1, target_rate=3.0, drafter_rate=5.0, gpus=2)
    for t, d in itertools.product(range(1, 4), repeat=2):
        alone = [(1, 0)] * t + [(0, 1)] * d
        assert abs(saturation_rate(3.0, 5.0, t, d, alone) - split_rate(rates, t, d)) < 1e-9
    # 2 targets + 2 drafters on 2 GPUs, a target and a drafter on each: each GPU carries
    # half of each role's work, so the node moves 1 / (0.5 / 3 + 0.5 / 5) = 3.75.
    assert abs(saturation_rate(3.0, 5.0, 2, 2, [(1, 1), (1, 1)]) - 3.75) < 1e-9
    # One tensor-parallel group on both GPUs keeps both busy: 1 / (1 / 3 + 0.5 / 5).
    assert abs(saturation_rate(3.0, 5.0, 1, 2, [(1, 1), (1, 1)]) - 1 / (1 / 3 + 0.1)) < 1e-9


def test_a_target_group_counts_once_and_splits_give_it_its_gpus() -> None:
    # Ranks 0 and 1 are one tensor-parallel group (only the lead, rank 0, moves items):
    # 60 batches in 10 s, blocked 8 s -> 30 batches/s while not blocked; each drafter 50
    # batches, never starved -> 5 batches/s.
    roles = ("target", "target", "drafter", "drafter")
    before = _figures([(r, role, r, 0, 0.0, 0.0) for r, role in enumerate(roles)])
    items, blocked = (60, 0, 50, 50), (8.0, 0.0, 0.0, 0.0)
    after = _figures([(r, roles[r], r, items[r], 10.0, blocked[r]) for r in range(4)])
    rates = measured_rates(intervals(before, after), gpus_per_target=2)
    assert (rates.targets, rates.drafters, rates.gpus, rates.target_rate) == (1, 2, 4, 30.0)
    text = "\n".join(advise(rates))
    assert "one target group makes 30 batches/s" in text
    assert "now  1 target group of 2 GPUs + 2 drafters: min(1 x 30, 2 x 5) = 10" in text
    assert text.endswith("=> the current split is the fastest")

    eight = MeasuredRates(
        targets=2, drafters=4, target_rate=60_000, drafter_rate=12_000, gpus=8, gpus_per_target=2
    )
    best = best_split(eight)
    assert (best.targets, best.drafters, best.rate) == (1, 6, 60_000)
    assert split_rate(eight, 3, 2) == 24_000  # 3 groups take 6 of the 8 GPUs
    assert advise(eight)[-1] == (
        "  => 1 target group of 2 GPUs + 6 drafters would be fastest: ~60.0k tok/s"
    )


def test_layout_rates_use_the_trainers_roles_and_the_busiest_gpu() -> None:
    assert [local_role(r, 2) for r in range(4)] == ["target", "target", "drafter", "drafter"]
    # Each GPU holds one of the two targets and one of the two drafters.
    crossed = LayoutConfig(targets_per_node=2, drafters_per_node=2, gpu_map=[0, 1, 0, 1])
    assert gpu_residents(crossed) == [(1, 1), (1, 1)]
    assert layout_rate(crossed, 3.0, 5.0) == pytest.approx(1 / (0.5 / 3 + 0.5 / 5))
    # One group of two spans both GPUs: each carries the whole group and half the drafting.
    grouped = LayoutConfig(
        targets_per_node=2, drafters_per_node=2, target_tp=2, gpu_map=[0, 1, 0, 1]
    )
    assert layout_rate(grouped, 3.0, 5.0) == pytest.approx(1 / (1 / 3 + 0.5 / 5))
    # One rank per GPU: the slower side, as the split advice counts it.
    alone = LayoutConfig(targets_per_node=1, drafters_per_node=2, gpu_map=[0, 1, 2])
    assert gpu_residents(alone) == [(1, 0), (0, 1), (0, 1)]
    assert layout_rate(alone, 3.0, 5.0) == pytest.approx(3.0)
    with pytest.raises(ConfigError, match="target_tp = 2 does not divide"):
        check_layout(LayoutConfig(targets_per_node=3, drafters_per_node=1, target_tp=2))
    with pytest.raises(ConfigError, match=r"give one GPU per rank \(2 ranks, targets first\)"):
        gpu_residents(LayoutConfig(targets_per_node=1, drafters_per_node=1, gpu_map=[0]))


def test_a_tie_keeps_more_targets_and_is_no_reason_to_change_the_split() -> None:
    # 4 GPUs, a target 20/s, a drafter 10/s: 2 + 2 and 1 + 3 both move 20, 3 + 1 moves 10.
    rates = MeasuredRates(targets=1, drafters=3, target_rate=20.0, drafter_rate=10.0, gpus=4)
    best = best_split(rates)
    assert (best.targets, best.drafters, best.rate) == (2, 2, 20.0)
    lines = advise(rates)
    assert "  best 2 targets + 2 drafters: min(2 x 20, 2 x 10) = 20 tok/s, 1.00x now" in lines
    assert lines[-1] == "  => nothing here beats the current split's 20 tok/s"


def test_ranks_sharing_gpus_are_compared_with_their_measured_rate() -> None:
    # 2 targets + 2 drafters share 2 GPUs and move 4 tok/s together. Their shared-GPU rates
    # would give 1 + 1, one rank per GPU, min(10, 10) = 10 tok/s: that beats the measured
    # 4, not the 40 that the same arithmetic predicts for 2 + 2 (no arithmetic predicts
    # ranks sharing a GPU).
    rates = MeasuredRates(2, 2, 10.0, 10.0, gpus=2, measured=4.0, shared=True)
    lines = advise(rates)
    assert "  now  2 targets + 2 drafters sharing 2 GPUs: measured 4 tok/s" in lines
    assert "  best 1 target + 1 drafter: min(1 x 10, 1 x 10) = 10 tok/s, 2.50x now" in lines
    assert lines[-1] == "  => 1 target + 1 drafter would be fastest: ~10 tok/s"


def test_shared_gpus_without_a_target_and_a_drafter_on_each_are_not_colocation() -> None:
    # GPU 0 holds a target and a drafter, GPU 1 two drafters: a measured rate of that
    # layout says nothing of one target and one drafter per GPU.
    placed = [(0, "target", 0), (1, "drafter", 0), (2, "drafter", 1), (3, "drafter", 1)]
    before = _figures([(rank, role, device, 0, 0.0, 0.0) for rank, role, device in placed])
    after = _figures([(rank, role, device, 40, 10.0, 0.0) for rank, role, device in placed])
    rates = measured_rates(intervals(before, after))
    assert rates is not None and rates.shared and rates.colocated_rate is None
    assert not any("co-locat" in line for line in advise(rates))
