"""ringtrain-data regenerate against OpenAI-compatible servers on 127.0.0.1
(ringtrain/testing/chat_server.py): contents per record and turn, options passed through, retried
faults, bad input lines."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path

import pytest

from ringtrain.cli.data import main as data_main
from ringtrain.data import DatasetError
from ringtrain.data import regenerate as regenerate_module
from ringtrain.data.regen_client import RetryPolicy, Sampling
from ringtrain.data.regenerate import RegenerateOptions, RegenerateTotals, regenerate
from ringtrain.testing.chat_server import ChatServer, Faults
from ringtrain.testing.regenerate_chats import (
    MODEL,
    assert_all_regenerated,
    read_output,
    write_chats,
)
from tests.helpers.stops import stop_inside_a_finalizer


def _args(servers: list[ChatServer], chats: Path, output: Path, *extra: str) -> list[str]:
    urls = [arg for server in servers for arg in ("--server", server.url)]
    return [
        "regenerate",
        *urls,
        "--model",
        MODEL,
        "--input",
        str(chats),
        "--output",
        str(output),
        *extra,
    ]


def test_records_and_turns_are_regenerated_over_two_servers(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    chats, output = tmp_path / "chats.jsonl", tmp_path / "out.jsonl"
    good = write_chats(chats, 40)
    with ChatServer() as first, ChatServer() as second:
        assert data_main(_args([first, second], chats, output, "--concurrency", "6")) == 0
        served = len(first.requests), len(second.requests)
    assert_all_regenerated(chats, output, good)
    # 10 records of each kind: 1 + 2 + 1 + 2 turns to answer.
    assert sum(served) == 60 and min(served) > 0
    assert (tmp_path / "out.jsonl.errors.jsonl").read_text() == ""
    captured = capsys.readouterr()
    assert "40/40" in captured.err  # the progress bar
    assert "40 records regenerated" in captured.out


def test_the_tokens_generated_count_every_turn_of_a_record(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """The summary's generated tokens are the completion tokens of every regenerated turn,
    records of two turns included."""
    chats, output = tmp_path / "chats.jsonl", tmp_path / "out.jsonl"
    write_chats(chats, 8)
    with ChatServer() as server:
        assert data_main(_args([server], chats, output, "--no-progress")) == 0
    turns = [t for r in read_output(output).values() for t in r["regeneration"]["turns"]]
    assert len(turns) > 8  # some records have two turns
    tokens = sum(t["completion_tokens"] for t in turns)
    out = capsys.readouterr().out
    assert f", {tokens} tokens generated, 0 answers cut at --max-tokens" in out, out


def test_sampling_options_reach_the_server(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Every answer is cut at --max-tokens 5, and the summary counts each cut turn."""
    chats, output = tmp_path / "chats.jsonl", tmp_path / "out.jsonl"
    good = write_chats(chats, 8)
    extra = ("--max-tokens", "5", "--temperature", "0.5", "--no-progress")
    kwargs = '{"enable_thinking": false}'
    with ChatServer() as server:
        assert (
            data_main(_args([server], chats, output, *extra, "--chat-template-kwargs", kwargs)) == 0
        )
        bodies = server.requests
    assert {body["temperature"] for body in bodies} == {0.5}
    assert {json.dumps(body["chat_template_kwargs"]) for body in bodies} == {kwargs}
    sampling = {"max_tokens": 5, "temperature": 0.5, "chat_template_kwargs": json.loads(kwargs)}
    assert_all_regenerated(chats, output, good, **sampling)
    records = read_output(output)
    turns = [t for r in records.values() for t in r["regeneration"]["turns"]]
    assert len(turns) > 8 and all(t["finish_reason"] == "length" for t in turns)
    assert f", {len(turns)} answers cut at --max-tokens" in capsys.readouterr().out
    assert not any("reasoning_content" in m for r in records.values() for m in r["messages"])


def test_injected_errors_drops_and_timeouts_are_retried(tmp_path: Path) -> None:
    chats, output = tmp_path / "chats.jsonl", tmp_path / "out.jsonl"
    good = write_chats(chats, 60)
    faults = Faults(error_rate=0.15, drop_rate=0.1, hang_rate=0.04, seed=3)
    with ChatServer(faults=faults) as server:
        options = RegenerateOptions(
            servers=[server.url],
            sampling=Sampling(MODEL),
            input=chats,
            output=output,
            concurrency=8,
            timeout_s=0.5,
            retry=RetryPolicy(retries=10, backoff_s=0.01, backoff_max_s=0.05),
        )
        totals = regenerate(options, progress=None)
        answered, injected = len(server.requests), server.injected
    assert set(injected) == {"error", "drop", "hang"}
    assert totals.failed == 0 and totals.written == 60
    assert totals.requests == answered + sum(injected.values())
    assert_all_regenerated(chats, output, good)


def test_bad_input_lines_are_reported_and_the_others_done(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    chats, output = tmp_path / "chats.jsonl", tmp_path / "out.jsonl"
    bad = {
        3: "{not json",
        5: json.dumps({"messages": [{"role": "robot", "content": "beep"}]}),
        6: json.dumps({"messages": [{"role": "system", "content": "nothing to answer"}]}),
        9: "",  # blank lines are skipped, not errors
    }
    good = write_chats(chats, 10, bad)
    with ChatServer() as server:
        assert data_main(_args([server], chats, output, "--no-progress")) == 1
    assert_all_regenerated(chats, output, good)
    errors = [
        json.loads(line) for line in (tmp_path / "out.jsonl.errors.jsonl").read_text().splitlines()
    ]
    assert [e["input_line"] for e in errors] == [3, 5, 6]
    assert all(e["where"] == f"{chats}:{e['input_line']}" for e in errors)
    captured = capsys.readouterr()
    for number, reason in (
        (3, "not valid JSON"),
        (5, "role 'robot'"),
        (6, "nothing to regenerate"),
    ):
        assert f"{chats}:{number}" in captured.err and reason in captured.err
    assert "3 records failed" in captured.out


def test_other_settings_are_refused_and_resume_needs_an_output(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    chats, output = tmp_path / "chats.jsonl", tmp_path / "out.jsonl"
    write_chats(chats, 4)
    with ChatServer() as server:
        assert data_main(_args([server], chats, output, "--resume", "--no-progress")) == 2
        assert "nothing to resume" in capsys.readouterr().err
        assert data_main(_args([server], chats, output, "--no-progress")) == 0
        assert data_main(_args([server], chats, output, "--temperature", "1", "--no-progress")) == 2
        assert "temperature: 0.0 -> 1.0" in capsys.readouterr().err
        assert data_main(_args([server], chats, output, "--top-p", "0.5", "--no-progress")) == 2
        assert "top_p: None -> 0.5" in capsys.readouterr().err
        assert data_main(_args([server], chats, output, "--resume", "--no-progress")) == 0
        assert len(server.requests) == 6  # the rerun asked nothing
    assert "0 records regenerated" in capsys.readouterr().out


def test_wrong_model_or_url_is_named(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    chats, output = tmp_path / "chats.jsonl", tmp_path / "out.jsonl"
    write_chats(chats, 2)
    with ChatServer() as server:
        args = _args([server], chats, output, "--no-progress")
        args[args.index(MODEL)] = "Qwen3-8B"
        assert data_main(args) == 2
        assert "does not serve model 'Qwen3-8B' (it serves echo)" in capsys.readouterr().err
        args = _args([server], chats, tmp_path / "other.jsonl", "--no-progress")
        args[args.index(server.url)] = server.url.removesuffix("/v1")
        assert data_main(args) == 2
        assert "pass the engine's OpenAI base URL" in capsys.readouterr().err
        assert server.requests == []


def _regenerate_without_content(
    faults: Faults, chats: Path, output: Path, retry: RetryPolicy
) -> tuple[RegenerateTotals, int]:
    """Regenerate against a server that answers without content as ``faults`` says:
    the run's totals and how many such answers the server sent."""
    with ChatServer(faults=faults) as server:
        options = RegenerateOptions(
            servers=[server.url], sampling=Sampling(MODEL), input=chats, output=output,
            retry=retry,
        )  # fmt: skip
        totals = regenerate(options, progress=None)
        return totals, server.injected["no_content"]


def test_an_answer_without_content_is_a_failed_record_not_an_empty_turn(tmp_path: Path) -> None:
    chats, output = tmp_path / "chats.jsonl", tmp_path / "out.jsonl"
    write_chats(chats, 3)
    totals, injected = _regenerate_without_content(
        Faults(no_content_rate=1.0), chats, output, RetryPolicy(2, 0.01, 0.02)
    )
    # Each record's first turn is tried three times (content missing, then null, ...).
    assert injected == 9
    assert totals.written == 0 and totals.failed == 3
    assert not output.exists()  # a run that wrote no record leaves no output behind
    errors = [
        json.loads(line) for line in (tmp_path / "out.jsonl.errors.jsonl").read_text().splitlines()
    ]
    assert sorted(e["input_line"] for e in errors) == [1, 2, 3]
    assert all("without choices[0].message.content" in e["error"] for e in errors)


def test_answers_without_content_are_retried_until_one_has_it(tmp_path: Path) -> None:
    chats, output = tmp_path / "chats.jsonl", tmp_path / "out.jsonl"
    good = write_chats(chats, 20)
    totals, injected = _regenerate_without_content(
        Faults(no_content_rate=0.3, seed=5), chats, output, RetryPolicy(20, 0.001, 0.01)
    )
    assert injected > 2 and totals.failed == 0
    assert_all_regenerated(chats, output, good)


def test_a_concurrency_below_one_is_refused_by_name(tmp_path: Path) -> None:
    chats = tmp_path / "chats.jsonl"
    write_chats(chats, 2)
    options = RegenerateOptions(
        servers=["http://127.0.0.1:9/v1"],
        sampling=Sampling(MODEL),
        input=chats,
        output=tmp_path / "out.jsonl",
        concurrency=0,
    )
    with pytest.raises(DatasetError, match="concurrency must be at least 1, not 0"):
        regenerate(options, progress=None)
    assert not (tmp_path / "out.jsonl").exists()


def test_the_api_key_is_sent_as_a_bearer_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """A server that answers only requests carrying its key: --api-key (or $OPENAI_API_KEY)
    reaches it on every request; without the key the run fails naming HTTP 401."""
    chats, output = tmp_path / "chats.jsonl", tmp_path / "out.jsonl"
    good = write_chats(chats, 4)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with ChatServer(api_key="sk-test") as server:
        extra = ("--no-progress", "--api-key", "sk-test")
        assert data_main(_args([server], chats, output, *extra)) == 0
        assert server.refused == 0 and len(server.requests) == 6
        assert_all_regenerated(chats, output, good)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
        from_env = tmp_path / "from_env.jsonl"
        assert data_main(_args([server], chats, from_env, "--no-progress")) == 0
        assert_all_regenerated(chats, from_env, good)
        capsys.readouterr()
        monkeypatch.setenv("OPENAI_API_KEY", "sk-wrong")
        refused = tmp_path / "refused.jsonl"
        assert data_main(_args([server], chats, refused, "--no-progress")) != 0
        assert server.refused > 0 and len(server.requests) == 12
    error = capsys.readouterr().err
    assert "HTTP 401" in error and "Traceback" not in error, error


def test_a_stop_python_dropped_in_a_finalizer_ends_the_run_at_the_next_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """A SIGTERM whose exception a finalizer swallowed while a record was regenerated
    (Python reports it and goes on) stops the run before the next record: the records
    done are kept, the stop is named, exit status 143, and a rerun finishes the rest."""
    monkeypatch.setattr(sys, "unraisablehook", lambda _report: None)
    one_record = regenerate_module.regenerate_record
    records = []

    async def record_dropping_a_stop(client, record):
        answer = await one_record(client, record)
        records.append(record.line)
        if len(records) == 1:
            stop_inside_a_finalizer()
        return answer

    monkeypatch.setattr(regenerate_module, "regenerate_record", record_dropping_a_stop)
    chats, output = tmp_path / "chats.jsonl", tmp_path / "out.jsonl"
    good = write_chats(chats, 40)
    with ChatServer() as server:
        extra = ("--concurrency", "1", "--no-progress")
        assert data_main(_args([server], chats, output, *extra)) == 128 + signal.SIGTERM
        assert "stopped by SIGTERM" in capsys.readouterr().err
        assert len(records) == 1 and len(read_output(output)) == 1
        monkeypatch.setattr(regenerate_module, "regenerate_record", one_record)
        assert data_main(_args([server], chats, output, *extra)) == 0
    assert_all_regenerated(chats, output, good)
