"""Metrics records as the named scalars TensorBoard and W&B show: which fields become
scalars and under what names, tokens per second, and the ring's rates and waits over the
interval since the step record before."""

from __future__ import annotations

from typing import Any

import pytest

from ringtrain.monitor.scalars import ScalarConverter
from tests.helpers.monitor_records import BLOCK_POSITIONS, eval_record, step_record

POSITIONS = [f"pos{k}" for k in range(1, BLOCK_POSITIONS + 1)]


def test_a_step_records_measurements_become_scalars_and_its_ids_do_not() -> None:
    record = step_record(2)
    record["verdict"] = {"steps": [1, 2], "line": "balanced", "advice": ["keep the split"]}
    step, scalars = ScalarConverter().scalars(record)
    assert step == 2
    assert set(scalars) == {
        "train/loss", "train/tau_uniform", "train/tokens", "train/seconds", "train/lr",
        "train/compiles", "train/tokens_per_s", "ring/occupancy", "gpu/busy",
        "gpu/busy_of_rank/0", "gpu/busy_of_rank/1", "gpu/busy_of_rank/2",
        *(f"train/accuracy/{pos}" for pos in POSITIONS),
    }  # fmt: skip
    assert scalars["train/tokens"] == 1002.0 and scalars["train/compiles"] == 3.0
    assert scalars["train/accuracy/pos1"] == pytest.approx(0.2)  # the first predicted token
    assert scalars["train/accuracy/pos7"] == pytest.approx(0.2 / 7)
    assert scalars["gpu/busy_of_rank/2"] == 0.9
    assert scalars["train/tokens_per_s"] == pytest.approx(1002 / 0.5)


def test_an_evaluation_records_scalars_leave_out_its_round() -> None:
    step, scalars = ScalarConverter().scalars(eval_record(4, 3))
    assert step == 4
    assert set(scalars) == {
        "eval/loss", "eval/weight_sum", "eval/accuracy", "eval/tau_uniform", "eval/blocks",
        "eval/scored_labels", "eval/tau_sim", "eval/replay_tokens", "eval/replay_steps",
        *(f"eval/accuracy/{pos}" for pos in POSITIONS),
    }  # fmt: skip
    assert scalars["eval/accuracy/pos2"] == pytest.approx(0.15)


def test_a_start_record_and_a_step_of_no_time_convert_quietly() -> None:
    converter = ScalarConverter()
    assert converter.scalars({"event": "start", "wall": 1.0, "resumed_step": 3}) == (0, {})
    record = step_record(1, ring=False, gpu=False) | {"seconds": 0.0}
    step, scalars = converter.scalars(record)
    assert step == 1 and scalars["train/seconds"] == 0.0
    assert "train/tokens_per_s" not in scalars  # no rate over no time
    assert not any(name.startswith(("ring/", "gpu/")) for name in scalars)


def _ring_step(step: int, target: tuple[int, float, float], drafter: tuple[int, float, float]):
    """A step record whose ring counters are (items, seconds attached, seconds waited) of
    one target and one drafter."""
    record: dict[str, Any] = step_record(step, gpu=False)
    record["ring"] = {
        "occupancy": 0.25 * step,
        "ranks": [[0, "target", 0, *target], [1, "drafter", 1, *drafter]],
    }
    return record


def test_ring_rates_and_waits_are_over_the_interval_since_the_step_before() -> None:
    converter = ScalarConverter()
    records = [
        _ring_step(1, (10, 1.0, 0.2), (10, 1.0, 0.1)),
        # Over 1 s: the target makes 10 items and is blocked half of it; the drafter takes 4.
        _ring_step(2, (20, 2.0, 0.7), (14, 2.0, 0.1)),
        # Over 2 s: the target is never blocked, the drafter starves 1 s and takes 16.
        _ring_step(3, (40, 4.0, 0.7), (30, 4.0, 1.1)),
    ]
    first, second, third = (converter.scalars(r)[1] for r in records)
    assert {k: v for k, v in first.items() if k.startswith("ring/")} == {"ring/occupancy": 0.25}
    ring = {k: v for k, v in second.items() if k.startswith("ring/")}
    assert ring == pytest.approx(
        {
            "ring/occupancy": 0.5,
            "ring/targets_blocked_pct": 50.0,
            "ring/drafters_starved_pct": 0.0,
            "ring/rank0_target/items_per_s": 10.0,
            "ring/rank0_target/wait_pct": 50.0,
            "ring/rank1_drafter/items_per_s": 4.0,
            "ring/rank1_drafter/wait_pct": 0.0,
        }
    )
    assert third["ring/targets_blocked_pct"] == pytest.approx(0.0)
    assert third["ring/drafters_starved_pct"] == pytest.approx(50.0)
    assert third["ring/rank0_target/items_per_s"] == pytest.approx(10.0)
    assert third["ring/rank1_drafter/items_per_s"] == pytest.approx(8.0)
    assert third["ring/rank1_drafter/wait_pct"] == pytest.approx(50.0)
