"""Metrics records (the lines of metrics.jsonl) as named scalars for TensorBoard and W&B.

Names are `<section>/<figure>`: `train/...` for step records, `eval/...` for evaluation
records, `gpu/...` for GPU busy fractions, `ring/...` for the ring. Every numeric field
becomes a scalar; a list of per-block-position values becomes one scalar per position
(`train/accuracy/pos1` is block position 1, the first predicted token); a dict becomes one
scalar per key. Ring figures are turned into rates and wait percentages over the interval
since the previous step record, so the converter keeps that record's ring counters.
"""

from __future__ import annotations

from typing import Any

from ringtrain.monitor.ring_figures import (
    RankFigures,
    RankInterval,
    figures_of_record,
    intervals,
    role_mean,
)

# Fields that identify a record rather than measure something (a step's verdict: its line
# and the steps it judged).
_NOT_SCALARS = {"event", "step", "wall", "batches", "ring", "round", "verdict"}
_SECTION = {"step": "train", "eval": "eval"}
_RENAMED = {"gpu_busy": "gpu/busy", "gpu_busy_by_rank": "gpu/busy_of_rank"}
_PER_POSITION = {"accuracy_per_slot": "accuracy"}


def _flatten(name: str, value: Any, out: dict[str, float]) -> None:
    if isinstance(value, bool | int | float):
        out[name] = float(value)
    elif isinstance(value, list):
        for position, item in enumerate(value, start=1):
            _flatten(f"{name}/pos{position}", item, out)
    elif isinstance(value, dict):
        for key, item in value.items():
            _flatten(f"{name}/{key}", item, out)


def _ring_scalars(ranks: list[RankInterval], occupancy: float) -> dict[str, float]:
    out = {"ring/occupancy": occupancy}
    for role, wait in (("target", "targets_blocked_pct"), ("drafter", "drafters_starved_pct")):
        share = role_mean(ranks, role, "wait_share")
        if share is not None:
            out[f"ring/{wait}"] = 100.0 * share
    for r in ranks:
        out[f"ring/rank{r.rank}_{r.role}/items_per_s"] = r.items_per_s
        out[f"ring/rank{r.rank}_{r.role}/wait_pct"] = 100.0 * r.wait_share
    return out


class ScalarConverter:
    """Turns records into (step, {name: value}); keeps the last step record's ring counters."""

    def __init__(self) -> None:
        self._ring_before: list[RankFigures] | None = None

    def scalars(self, record: dict[str, Any]) -> tuple[int, dict[str, float]]:
        """The record's step and its scalars (empty for records that carry none)."""
        event = record.get("event")
        section = _SECTION.get(event)
        out: dict[str, float] = {}
        if section is None:
            return int(record.get("step", 0)), out
        for key, value in record.items():
            if key in _NOT_SCALARS or value is None:
                continue
            name = _RENAMED.get(key) or f"{section}/{_PER_POSITION.get(key, key)}"
            _flatten(name, value, out)
        if event == "step":
            if record.get("seconds"):
                out["train/tokens_per_s"] = record["tokens"] / record["seconds"]
            out.update(self._ring(record))
        return int(record["step"]), out

    def _ring(self, record: dict[str, Any]) -> dict[str, float]:
        figures = figures_of_record(record)
        if figures is None:
            return {}
        before, self._ring_before = self._ring_before, figures
        if before is None:
            return {"ring/occupancy": float(record["ring"]["occupancy"])}
        return _ring_scalars(intervals(before, figures), float(record["ring"]["occupancy"]))
