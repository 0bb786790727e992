"""run.report_to's sinks over a run's sessions: the sink each entry opens, a resumed session
that evaluates before its first step, a session that logs nothing, the steps' wall times in
TensorBoard, and a resumed session continuing its W&B run."""

from __future__ import annotations

from pathlib import Path

import pytest

from ringtrain.config import parse_config
from ringtrain.monitor.sinks import WANDB_ID_FILE, TensorBoardSink, open_sinks
from tests.helpers.monitor_records import WALL0, eval_record, step_record

pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed")

START = {"event": "start", "wall": WALL0, "resumed_step": 0}


def _events(log_dir: Path, tag: str) -> list[tuple[int, float, float]]:
    """(step, value, wall time) of each event of `tag` TensorBoard's reader keeps, in order."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    reader = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    reader.Reload()
    return [(event.step, event.value, event.wall_time) for event in reader.Scalars(tag)]


def _offline_wandb(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for variable, folder in (("WANDB_CACHE_DIR", "cache"), ("WANDB_CONFIG_DIR", "config")):
        monkeypatch.setenv(variable, str(tmp_path / folder))


def test_report_to_tensorboard_opens_one_tensorboard_sink(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _offline_wandb(monkeypatch, tmp_path)  # nothing must reach W&B, were it opened
    config = parse_config("", overrides=['run.report_to=["tensorboard"]'])
    [sink] = open_sinks(config, tmp_path / "run")
    assert isinstance(sink, TensorBoardSink) and sink.log_dir == tmp_path / "run" / "tensorboard"
    assert open_sinks(parse_config(""), tmp_path / "run") == []


def test_a_resumed_session_that_evaluates_first_keeps_the_steps_before_it(
    tmp_path: Path,
) -> None:
    """The run crashed after step 5 with the round due after step 3 not recorded; resumed
    from the step-3 checkpoint, the session evaluates that round, then trains step 4 on."""
    first = TensorBoardSink(tmp_path)
    for record in [START, *(step_record(step) for step in range(1, 6))]:
        first.write(record)
    first.close()
    resumed = TensorBoardSink(tmp_path)
    resumed.write(START | {"resumed_step": 3})
    resumed.write(eval_record(3, 1))
    for step in range(4, 7):
        resumed.write(step_record(step) | {"loss": 100.0 + step})
    resumed.close()
    steps, losses, _ = zip(*_events(tmp_path / "tensorboard", "train/loss"), strict=True)
    assert steps == (1, 2, 3, 4, 5, 6)  # each once: a step trained again replaces the old one
    assert losses == pytest.approx((6.0, 3.0, 2.0, 104.0, 105.0, 106.0))
    [(step, tau_sim, _)] = _events(tmp_path / "tensorboard", "eval/tau_sim")
    assert (step, tau_sim) == (3, pytest.approx(1.3))


def test_a_session_that_logs_no_scalar_closes_without_an_event_file(tmp_path: Path) -> None:
    TensorBoardSink(tmp_path).close()
    sink = TensorBoardSink(tmp_path)
    sink.write(START)
    sink.close()
    assert not (tmp_path / "tensorboard").exists()


def test_tensorboard_shows_each_scalar_at_its_steps_wall_time(tmp_path: Path) -> None:
    sink = TensorBoardSink(tmp_path)
    for step in (1, 2, 3):
        sink.write(step_record(step))
    sink.close()
    steps, _, walls = zip(*_events(tmp_path / "tensorboard", "train/loss"), strict=True)
    assert steps == (1, 2, 3)
    assert walls == pytest.approx(tuple(WALL0 + step for step in steps))


def test_a_resumed_session_continues_its_wandb_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wandb = pytest.importorskip("wandb", reason="the wandb extra is not installed")
    from ringtrain.monitor.sinks import WandbSink

    _offline_wandb(monkeypatch, tmp_path)
    monkeypatch.setenv("WANDB_PROJECT", "drafter-sweep")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for steps in ((1, 2), (2, 3)):  # the second session resumed from the step-1 checkpoint
        sink = WandbSink(run_dir, "synthetic", {"run": {"max_steps": 77123}})
        for record in [START, *map(step_record, steps)]:
            sink.write(record)
        sink.close()
    wandb.teardown()  # waits for W&B's service process to finish writing
    run_id = (run_dir / WANDB_ID_FILE).read_text().strip()
    histories = list((run_dir / "wandb").glob("offline-run-*/*.wandb"))
    assert histories and {path.name for path in histories} == {f"run-{run_id}.wandb"}
    for history in histories:
        logged = history.read_bytes()  # protobuf records; the config's values as JSON text
        assert b"drafter-sweep" in logged and b"77123" in logged
