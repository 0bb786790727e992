"""report_to sinks: TensorBoard event files read back with TensorBoard's own reader, W&B
offline run directories, and the pre-flight error for a missing package."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from ringtrain.config import ConfigError
from ringtrain.monitor.sinks import WANDB_ID_FILE, TensorBoardSink, check_report_to
from tests.helpers.monitor_records import eval_record, step_record, tensorboard_scalars

pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed")


def _records() -> list[dict]:
    records = [step_record(step) for step in range(1, 7)]
    records.insert(3, eval_record(3, 1))
    records.append(eval_record(6, 2))
    return records


def test_tensorboard_scalars_match_the_records(tmp_path: Path) -> None:
    records = _records()
    sink = TensorBoardSink(tmp_path)
    for record in records:
        sink.write(record)
    sink.close()
    scalars = tensorboard_scalars(tmp_path / "tensorboard")
    steps = [r for r in records if r["event"] == "step"]
    evals = [r for r in records if r["event"] == "eval"]
    approx = pytest.approx
    assert scalars["train/loss"] == approx({r["step"]: r["loss"] for r in steps})
    assert scalars["train/tau_uniform"] == approx({r["step"]: r["tau_uniform"] for r in steps})
    for position in range(1, 8):
        expected = {r["step"]: r["accuracy"][position - 1] for r in steps}
        assert scalars[f"train/accuracy/pos{position}"] == approx(expected)
        expected = {r["step"]: r["accuracy_per_slot"][position - 1] for r in evals}
        assert scalars[f"eval/accuracy/pos{position}"] == approx(expected)
    assert scalars["train/tokens_per_s"] == approx({r["step"]: r["tokens"] / 0.5 for r in steps})
    assert scalars["eval/tau_sim"] == approx({3: 1.3, 6: 1.4})
    assert scalars["eval/loss"] == approx({3: 5.0 / 3, 6: 5.0 / 6})
    assert scalars["gpu/busy"] == approx(dict.fromkeys(range(1, 7), 0.9))
    assert scalars["gpu/busy_of_rank/1"] == approx(dict.fromkeys(range(1, 7), 0.6))
    assert scalars["ring/occupancy"] == approx(dict.fromkeys(range(1, 7), 0.5))
    # Wait shares and rates over each interval between two step records.
    assert scalars["ring/targets_blocked_pct"] == approx(dict.fromkeys(range(2, 7), 25.0))
    assert scalars["ring/drafters_starved_pct"] == approx(dict.fromkeys(range(2, 7), 10.0))
    assert scalars["ring/rank2_drafter/items_per_s"] == approx(dict.fromkeys(range(2, 7), 2.0))
    assert "train/batches" not in scalars and "train/wall" not in scalars


def test_a_resumed_run_replaces_the_steps_it_trained_again(tmp_path: Path) -> None:
    first = TensorBoardSink(tmp_path)
    for step in range(1, 6):
        first.write(step_record(step))
    first.close()
    resumed = TensorBoardSink(tmp_path)  # resumed from the step-3 checkpoint
    for step in range(4, 8):
        record = step_record(step)
        record["loss"] = 100.0 + step
        resumed.write(record)
    resumed.close()
    loss = tensorboard_scalars(tmp_path / "tensorboard")["train/loss"]
    assert loss == pytest.approx({1: 6.0, 2: 3.0, 3: 2.0, 4: 104.0, 5: 105.0, 6: 106.0, 7: 107.0})


def test_a_missing_package_names_the_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    check_report_to(["tensorboard"])
    monkeypatch.setitem(sys.modules, "wandb", None)  # what an absent package looks like
    with pytest.raises(ConfigError, match=r"pip install 'ringtrain\[wandb\]'.*run\.report_to"):
        check_report_to(["tensorboard", "wandb"])
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    with pytest.raises(ConfigError, match=r"ringtrain\[tensorboard\]"):
        check_report_to(["tensorboard"])


def test_wandb_offline_writes_its_run_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wandb = pytest.importorskip("wandb", reason="the wandb extra is not installed")
    from ringtrain.monitor.sinks import WandbSink

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for variable, folder in (("WANDB_CACHE_DIR", "cache"), ("WANDB_CONFIG_DIR", "config")):
        monkeypatch.setenv(variable, str(tmp_path / folder))
    records = _records()
    losses = [1.0 + step / 7 for step in range(1, 7)]  # each one's JSON text is distinct
    for record in records:
        if record["event"] == "step":
            record["loss"] = losses[record["step"] - 1]
    sink = WandbSink(tmp_path, "synthetic", {"run": {"max_steps": 6}})
    for record in records:
        sink.write(record)
    sink.close()
    wandb.teardown()  # waits for W&B's service process to finish writing
    run_id = (tmp_path / WANDB_ID_FILE).read_text().strip()
    [run_dir] = (tmp_path / "wandb").glob(f"offline-run-*-{run_id}")
    [history] = run_dir.glob("*.wandb")
    logged = history.read_bytes()  # protobuf records holding each value as JSON text
    assert all(json.dumps(loss).encode() in logged for loss in losses)
    assert b"eval/tau_sim" in logged and b"ring/targets_blocked_pct" in logged
