"""The regeneration journal on disk: a torn last line is cut so the next record starts on
a line of its own, a repeated input line is refused, the errors file lists the latest
run's failures only, and an empty output takes a rerun's new settings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ringtrain.data.errors import DatasetError
from ringtrain.data.regen_journal import Journal, check_settings, errors_path, settings_path


def _record(input_line: int) -> dict:
    return {"messages": [], "regeneration": {"input_line": input_line}}


def _two_records() -> str:
    """The lines of records 1 and 2, each complete."""
    return "".join(json.dumps(_record(n)) + "\n" for n in (1, 2))


def test_a_torn_last_line_is_cut_and_the_next_record_is_whole(tmp_path: Path) -> None:
    output = tmp_path / "out.jsonl"
    torn = '{"messages": [], "regeneration": {"input_line": 3'
    output.write_text(_two_records() + torn)
    journal = Journal(output)
    assert journal.done == {1, 2}
    assert journal.cut_bytes == len(torn)
    journal.write(_record(3))
    journal.close()
    lines = output.read_text().splitlines()
    assert [json.loads(line)["regeneration"]["input_line"] for line in lines] == [1, 2, 3]


def test_an_input_line_written_twice_is_refused_by_its_line(tmp_path: Path) -> None:
    output = tmp_path / "out.jsonl"
    output.write_text(_two_records() + json.dumps(_record(1)) + "\n")
    with pytest.raises(DatasetError, match=rf"{output}:3: input line 1 is already in the file"):
        Journal(output)


def test_the_errors_file_lists_the_latest_runs_failures_only(tmp_path: Path) -> None:
    output = tmp_path / "out.jsonl"
    first = Journal(output)
    first.write_error(2, "chats.jsonl:2", "too long")
    first.close()
    second = Journal(output)
    second.write_error(5, "chats.jsonl:5", "server gone")
    second.close()
    errors = [json.loads(line) for line in errors_path(output).read_text().splitlines()]
    assert errors == [{"input_line": 5, "where": "chats.jsonl:5", "error": "server gone"}]
    assert second.errors == 1


def test_an_empty_output_takes_new_settings_and_one_with_records_refuses_them(
    tmp_path: Path,
) -> None:
    output = tmp_path / "out.jsonl"
    check_settings(output, {"temperature": 1.0}, resume=False)
    output.touch()  # a run that ended before writing a record
    check_settings(output, {"temperature": 0.5}, resume=False)
    assert json.loads(settings_path(output).read_text()) == {"temperature": 0.5}
    output.write_text(json.dumps(_record(1)) + "\n")
    with pytest.raises(DatasetError, match=r"made with other settings \(temperature: 0.5 -> 1.0\)"):
        check_settings(output, {"temperature": 1.0}, resume=True)
