"""A fresh start in a run directory that an earlier run left without a checkpoint: the
earlier metrics move aside under that run's id, and nothing speaks of resuming."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ringtrain.trainer.logs import MetricsWriter
from ringtrain.trainer.roles import RankInfo
from ringtrain.trainer.run_dir import RUN_ID_FILE, prepare_run_dir, read_run_id

RANK0 = RankInfo(0, 2, 0, 2, 0, 1, 0, "target", 0, 1, 1, 1, torch.device("cpu"))
EARLIER = '{"event": "start", "wall": 1.0, "resumed_step": 0}\n{"event": "step", "step": 1}\n'


def test_a_fresh_start_keeps_the_earlier_metrics_aside_and_says_nothing_of_resuming(
    tmp_path: Path,
) -> None:
    (tmp_path / RUN_ID_FILE).write_text("earlier0run1\n")
    (tmp_path / "metrics.jsonl").write_text(EARLIER)

    notes = prepare_run_dir(tmp_path, RANK0, resume=False, overwrite=False)
    metrics = MetricsWriter(tmp_path / "metrics.jsonl", resumed_step=0)
    metrics.close()

    said = " ".join(notes + metrics.notes).lower()
    assert "resum" not in said and "supersed" not in said
    assert notes == [
        "metrics.jsonl of the earlier run in this directory (no checkpoint) kept as "
        "metrics.earlier0run1.jsonl"
    ]
    assert (tmp_path / "metrics.earlier0run1.jsonl").read_text() == EARLIER
    assert not (tmp_path / "metrics.jsonl.pre-resume").exists()
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["event"] for r in records] == ["start"]
    assert read_run_id(tmp_path) != "earlier0run1"


def test_a_resume_keeps_its_metrics_in_place(tmp_path: Path) -> None:
    (tmp_path / RUN_ID_FILE).write_text("samerun0001\n")
    (tmp_path / "metrics.jsonl").write_text(EARLIER)

    assert prepare_run_dir(tmp_path, RANK0, resume=True, overwrite=False) == []
    assert (tmp_path / "metrics.jsonl").read_text() == EARLIER
    assert read_run_id(tmp_path) == "samerun0001"
