"""ringtrain-plot and the run reader: live and finished runs, resumed runs, non-runs."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from ringtrain.cli.plot import main as plot_main
from ringtrain.monitor.runlog import RunDirError, read_run
from tests.helpers.monitor_records import eval_record, step_record, write_run

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_a_live_run_with_a_torn_last_line_is_read(tmp_path: Path) -> None:
    records = [step_record(step) for step in range(1, 5)]
    torn = json.dumps(step_record(5))[:40]  # the writer is in the middle of this line
    run = read_run(write_run(tmp_path, records, tail=torn))
    assert [r["step"] for r in run.steps] == [1, 2, 3, 4]
    assert run.unreadable == 1 and run.restarts == [] and run.name == "synthetic"


def test_a_resumed_run_keeps_the_retrained_steps_and_marks_the_restart(tmp_path: Path) -> None:
    first = [step_record(step) for step in range(1, 6)]
    first.insert(3, eval_record(3, 1))
    first.append(eval_record(5, 2))  # evaluated after step 5, which is trained again
    resumed = [step_record(step) for step in range(4, 8)]
    for record in resumed:
        record["loss"] = 100.0
    cut = json.dumps(step_record(6))[:25] + "\n"  # a crash cut this line
    (tmp_path / "a").mkdir()
    write_run(tmp_path / "a", first)
    with (tmp_path / "a" / "metrics.jsonl").open("a") as file:
        file.write(cut + "".join(json.dumps(r) + "\n" for r in [{"event": "start"}, *resumed]))
    run = read_run(tmp_path / "a")
    assert [r["step"] for r in run.steps] == list(range(1, 8))
    assert [r["loss"] for r in run.steps[3:]] == [100.0] * 4
    assert [e["step"] for e in run.evals] == [3]
    assert run.restarts == [4] and run.unreadable == 1

    # A session that resumes right after the last step is found by its start record.
    boundary = [*first, {"event": "start", "wall": 1.0}, step_record(6), step_record(7)]
    assert read_run(write_run(tmp_path / "b", boundary)).restarts == [6]
    # Files written without start records: a step that does not follow the one before.
    legacy = [step_record(s) for s in (1, 2, 3, 2, 3, 4)]
    assert read_run(write_run(tmp_path / "c", legacy)).restarts == [2]


def test_a_step_logged_again_right_after_itself_is_a_restart(tmp_path: Path) -> None:
    """Without start records: the crash came right after step 3 was logged and the
    resumed session trained step 3 again; its record wins."""
    legacy = [step_record(s) for s in (1, 2, 3, 3, 4)]
    legacy[3]["loss"] = 100.0
    run = read_run(write_run(tmp_path, legacy))
    assert run.restarts == [3]
    assert [r["step"] for r in run.steps] == [1, 2, 3, 4] and run.steps[2]["loss"] == 100.0


def test_an_evaluation_at_the_step_a_session_resumes_from_is_dropped(tmp_path: Path) -> None:
    """The round due after step 4 was recorded, then the run crashed; resumed from the
    checkpoint of step 3, the session trains step 4 again and evaluates it again: only
    the new evaluation stays."""
    first = [*[step_record(s) for s in range(1, 5)], eval_record(4, 1), step_record(5)]
    again = eval_record(4, 1)
    again["tau_sim"] = 9.0
    resumed = [{"event": "start"}, step_record(4), again, step_record(5)]
    run = read_run(write_run(tmp_path, [*first, *resumed]))
    assert run.restarts == [4]
    assert [(e["step"], e["tau_sim"]) for e in run.evals] == [(4, 9.0)]


def test_what_is_not_a_run_is_refused_with_a_reason(tmp_path: Path) -> None:
    with pytest.raises(RunDirError, match="is not a ringtrain run directory"):
        read_run(tmp_path)
    with pytest.raises(RunDirError, match="is not a directory"):
        read_run(tmp_path / "missing")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(RunDirError, match=r"no step record yet.*does not exist"):
        read_run(tmp_path)
    (tmp_path / "metrics.jsonl").write_text('{"event": "start"}\n{"event": "st')
    with pytest.raises(RunDirError, match="no step record yet"):
        read_run(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "ringtrain.cli.plot", str(tmp_path.parent)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert "is not a ringtrain run directory" in done.stderr
    assert "pass the run.run_dir of a training run" in done.stderr


def test_a_finished_run_renders_one_png(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("matplotlib", reason="the plot extra is not installed")
    from PIL import Image

    records = [step_record(step) for step in range(1, 41)]
    for record in records[:25]:  # written before the uniform-anchor tau was renamed
        record["tau"] = record.pop("tau_uniform")
    records += [eval_record(20, 1), eval_record(40, 2)]
    records.insert(25, {"event": "start"})  # resumed after step 25
    run_dir = write_run(tmp_path / "run", records)
    assert plot_main([str(run_dir), "-o", str(tmp_path / "out" / "run.png")]) == 0
    assert "40 steps, 2 evaluations" in capsys.readouterr().out
    png = (tmp_path / "out" / "run.png").read_bytes()
    assert png.startswith(PNG_MAGIC)
    with Image.open(tmp_path / "out" / "run.png") as image:
        assert image.size == (1040, 800)
        colours = image.convert("RGB").getcolors(maxcolors=1 << 16)
    assert colours is not None and len(colours) > 50  # curves were drawn, not a blank page

    no_figures = [step_record(step, ring=False, gpu=False) for step in range(1, 3)]
    assert plot_main([str(write_run(tmp_path / "cpu", no_figures))]) == 0
    assert (tmp_path / "cpu" / "run.png").read_bytes().startswith(PNG_MAGIC)


def test_a_skipped_step_with_a_non_finite_loss_is_plotted_as_a_gap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loss curve drawn has no point at the skipped step (a NaN: matplotlib breaks the
    line there) and a point at every other step; the smoothed curve picks up again once its
    window has passed the gap."""
    pytest.importorskip("matplotlib", reason="the plot extra is not installed")
    from ringtrain.monitor import figure

    drawn = []
    monkeypatch.setattr(figure.plt, "close", drawn.append)  # keep the figure to inspect it
    records = [step_record(step) for step in range(1, 41)]
    records[9] |= {"loss": None, "skipped": True}  # step 10; NaN is null in JSON
    assert plot_main([str(write_run(tmp_path / "run", records))]) == 0
    assert (tmp_path / "run" / "run.png").read_bytes().startswith(PNG_MAGIC)
    raw, smoothed = drawn[0].axes[0].get_lines()[:2]
    assert list(raw.get_xdata()) == list(range(1, 41))
    assert [s for s, y in zip(range(1, 41), raw.get_ydata(), strict=True) if math.isnan(y)] == [10]
    assert [r["loss"] for r in records if r["step"] != 10] == [
        y for y in raw.get_ydata() if math.isfinite(y)
    ]
    gap = [s for s, y in zip(range(1, 41), smoothed.get_ydata(), strict=True) if math.isnan(y)]
    assert gap[0] == 10 and len(gap) == 40 // 20, gap


def test_malformed_records_are_skipped_and_named(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    records = [step_record(step) for step in range(1, 7)]
    del records[1]["loss"]
    records[3]["step"] = "x"
    records.append(eval_record(6, 1) | {"tau_sim": "high"})
    run_dir = write_run(tmp_path / "run", records)
    run = read_run(run_dir)
    assert [r["step"] for r in run.steps] == [1, 3, 5, 6]
    assert run.evals == [] and len(run.malformed) == 3
    assert plot_main([str(run_dir)]) == 0
    captured = capsys.readouterr()
    assert "4 steps, 0 evaluations (3 malformed record(s) skipped)" in captured.out
    for line, problem in ((2, "missing required field `loss`"), (4, "at `$.step`"), (7, "tau_sim")):
        assert f"metrics.jsonl line {line}: " in captured.err and problem in captured.err


def test_a_metrics_file_of_text_is_not_called_empty(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text("this is not\nJSON at all\n")
    with pytest.raises(RunDirError, match=r"holds 2 line\(s\) that are not JSON records"):
        read_run(tmp_path)
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"event": "step", "step": 1}) + "\n")
    with pytest.raises(RunDirError, match="line 1: step record: Object missing required field"):
        read_run(tmp_path)
