"""The run reader (ringtrain.monitor.runlog) on metrics files a crash or an older trainer
left: lines that are not records, records missing what the figures read, a config.json cut
short."""

from __future__ import annotations

import json
from pathlib import Path

from ringtrain.monitor.runlog import read_run
from tests.helpers.monitor_records import step_record, write_run


def test_json_lines_that_are_not_records_are_counted_and_blank_lines_ignored(
    tmp_path: Path,
) -> None:
    lines = [
        json.dumps(step_record(1)),
        "",
        "[1, 2]",  # JSON, but not a record
        json.dumps(step_record(2)),
        "   ",
        "42",
        json.dumps(step_record(3)),
    ]
    run_dir = write_run(tmp_path / "run", [])
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    run = read_run(run_dir)
    assert [r["step"] for r in run.steps] == [1, 2, 3]
    assert run.unreadable == 2 and run.malformed == []


def test_a_step_record_without_tau_is_skipped_and_named(tmp_path: Path) -> None:
    records = [step_record(step) for step in (1, 2, 3)]
    del records[1]["tau_uniform"]
    run = read_run(write_run(tmp_path / "run", records))
    assert [r["step"] for r in run.steps] == [1, 3]
    assert run.malformed == ["line 2: step record: Object missing required field `tau_uniform`"]


def test_a_step_with_a_slot_of_no_accuracy_is_kept(tmp_path: Path) -> None:
    """A block position with no scored label has a NaN accuracy, null in JSON."""
    records = [step_record(step) for step in (1, 2)]
    records[1]["accuracy"][-1] = None
    run = read_run(write_run(tmp_path / "run", records))
    assert [r["step"] for r in run.steps] == [1, 2] and run.malformed == []
    assert run.steps[1]["accuracy"][-1] is None


def test_a_config_cut_short_reads_as_none_and_the_run_is_named_by_its_directory(
    tmp_path: Path,
) -> None:
    run_dir = write_run(tmp_path / "my-run", [step_record(1)])
    (run_dir / "config.json").write_text('{"run": {"na')  # the crash came mid-write
    run = read_run(run_dir)
    assert run.config == {} and run.name == "my-run"
    (run_dir / "config.json").write_text('{"run": {"max_steps": 4}}')
    assert read_run(run_dir).name == "my-run"
