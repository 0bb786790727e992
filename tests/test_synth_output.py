"""Synthesis's output file: records appended whole, read back when it is opened again (their
first user turns and the round a rerun continues from), a torn last line cut off and
counted, and lines that are not synthesized records refused by file and line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ringtrain.data.errors import DatasetError
from ringtrain.data.synth_output import SynthesisOutput


def _record(prompt: str, round_: int, system: str | None = None) -> dict:
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": prompt})
    return {"messages": messages, "synthesis": {"round": round_, "seed": 0}}


def _write(path: Path, records: list[dict]) -> None:
    output = SynthesisOutput(path)
    for record in records:
        output.write(record)
    output.close()


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_new_output_is_created_empty_and_starts_at_round_0(tmp_path: Path) -> None:
    output = SynthesisOutput(tmp_path / "prompts.jsonl")
    try:
        assert (output.records, output.cut_bytes, output.next_round) == ([], 0, 0)
        assert output.path.read_bytes() == b""
    finally:
        output.close()


def test_records_are_appended_one_line_each_and_a_reopened_output_keeps_them(
    tmp_path: Path,
) -> None:
    path = tmp_path / "prompts.jsonl"
    first = [_record("write a poem", 0, system="be brief"), _record("sort a list", 2)]
    _write(path, first)
    assert _lines(path) == first
    output = SynthesisOutput(path)
    try:
        assert [r.first_user_turn for r in output.records] == ["write a poem", "sort a list"]
        assert output.next_round == 3  # after the last round written
        output.write(_record("explain rain", 3))
    finally:
        output.close()
    assert _lines(path) == [*first, _record("explain rain", 3)]


def test_the_next_round_follows_the_latest_round_whatever_the_order(tmp_path: Path) -> None:
    path = tmp_path / "prompts.jsonl"
    _write(path, [_record("a", 4), _record("b", 6), _record("c", 5)])
    output = SynthesisOutput(path)
    output.close()
    assert output.next_round == 7


def test_a_torn_last_line_is_cut_off_and_counted(tmp_path: Path) -> None:
    path = tmp_path / "prompts.jsonl"
    _write(path, [_record("write a poem", 0), _record("sort a list", 1)])
    whole = path.read_bytes()
    torn = b'{"messages": [{"role": "user", "content": "tor'
    path.write_bytes(whole + torn)
    output = SynthesisOutput(path)
    try:
        assert output.cut_bytes == len(torn)
        assert [r.first_user_turn for r in output.records] == ["write a poem", "sort a list"]
        assert path.read_bytes() == whole
        output.write(_record("explain rain", 2))
    finally:
        output.close()
    assert [r["messages"][0]["content"] for r in _lines(path)] == [
        "write a poem",
        "sort a list",
        "explain rain",
    ]


def test_an_output_of_whole_lines_is_left_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / "prompts.jsonl"
    _write(path, [_record("write a poem", 0)])
    whole = path.read_bytes()
    output = SynthesisOutput(path)
    output.close()
    assert (output.cut_bytes, path.read_bytes()) == (0, whole)


@pytest.mark.parametrize(
    ("line", "why"),
    [
        ('{"messages": [{"role": "user", "content": "hi"}]}', "missing required field"),
        ("not json at all", "malformed"),
        (json.dumps(_record("x", 0)).replace('"user"', '"assistant"'), "no user turn"),
    ],
)
def test_a_line_that_is_not_a_synthesized_record_is_refused_by_its_line(
    tmp_path: Path, line: str, why: str
) -> None:
    path = tmp_path / "prompts.jsonl"
    _write(path, [_record("write a poem", 0)])
    before = path.read_bytes() + line.encode() + b"\n"
    path.write_bytes(before + json.dumps(_record("sort a list", 1)).encode() + b"\n")
    with pytest.raises(
        DatasetError, match=rf"prompts\.jsonl:2: not a synthesized record \(.*{why}"
    ):
        SynthesisOutput(path)
