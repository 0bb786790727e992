"""ringtrain-data's command line, in-process: regenerate's options for the engine chosen (a
server or a local model) refused by name when they do not apply, the options a run gets, its
exit statuses, and the values argparse refuses for every subcommand (the commands' own
work is tested in test_regenerate, test_prepare, test_synthesize and the others)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ringtrain.cli.data import SERVER_MAX_TOKENS
from ringtrain.cli.data import main as data_main
from ringtrain.data import regenerate as regenerate_module
from ringtrain.data.regen_local import LocalEngine
from ringtrain.data.regenerate import RegenerateOptions, RegenerateTotals, ServerGone
from tests.helpers.chat_data import write_chats

SERVER = ["--server", "http://127.0.0.1:9/v1"]


@pytest.fixture
def files(tmp_path: Path) -> list[str]:
    """--input of the helpers' chats and --output beside it."""
    chats = write_chats(tmp_path / "chats.jsonl")
    return ["--input", str(chats), "--output", str(tmp_path / "out.jsonl")]


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch) -> list[RegenerateOptions]:
    """The options each regenerate run got (the run itself answers nothing)."""
    seen: list[RegenerateOptions] = []

    def record(options: RegenerateOptions, progress: object) -> RegenerateTotals:
        seen.append(options)
        return RegenerateTotals(records=1, written=1)

    monkeypatch.setattr(regenerate_module, "regenerate", record)
    return seen


@pytest.mark.parametrize(
    ("engine", "message"),
    [
        (["--local", "m", "--model", "x"], "--model names a served model; with --local, leave it"),
        (SERVER, "--server needs --model, the model name as the server lists it"),
        ([*SERVER, "--model", "x", "--device", "cpu", "--batch-size", "4"],
         "--device, --batch-size apply to --local only, not to --server"),
        ([*SERVER, "--model", "x", "--seed", "0"],
         "--seed applies to --local only, not to --server"),
        (["--local", "m", "--memory-limit", "12XB"],
         "--memory-limit: '12XB' is not a size; write it like 512MiB, 4GiB or 2G"),
    ],
)  # fmt: skip
def test_an_option_that_does_not_fit_the_engine_is_refused_by_name(
    engine: list[str],
    message: str,
    files: list[str],
    runs: list[RegenerateOptions],
    capsys: pytest.CaptureFixture,
) -> None:
    assert data_main(["regenerate", *engine, *files]) == 2
    assert message in capsys.readouterr().err
    assert runs == []


def test_a_server_run_answers_with_the_servers_default_length(
    files: list[str], runs: list[RegenerateOptions]
) -> None:
    assert data_main(["regenerate", *SERVER, "--model", "served-name", *files]) == 0
    [options] = runs
    assert (options.sampling.model, options.sampling.max_tokens) == (
        "served-name",
        SERVER_MAX_TOKENS,
    )
    assert options.local is None and options.servers == SERVER[1:]


def test_a_local_run_is_named_by_its_directory_and_keeps_its_settings(
    files: list[str], runs: list[RegenerateOptions], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    local = ["--local", "~/model", "--device", "cpu", "--batch-size", "3"]
    local += ["--memory-limit", "2GiB", "--threads", "2", "--seed", "7", "--temperature", "0.5"]
    assert data_main(["regenerate", *local, *files]) == 0
    [options] = runs
    assert options.sampling.model == str((tmp_path / "model").resolve())
    assert options.sampling.max_tokens is None  # the device's default, filled in by the run
    assert options.sampling.temperature == 0.5
    assert options.local == LocalEngine(tmp_path / "model", "cpu", "auto", 3, 2 << 30, 2, 7)


@pytest.mark.parametrize(
    ("ending", "status"),
    [
        (RegenerateTotals(records=2, written=1, failed=1), 1),
        (RegenerateTotals(records=2, written=1, stopped_by="SIGTERM"), 143),
        (ServerGone("every server refused"), 3),
    ],
)
def test_the_exit_status_says_how_the_run_ended(
    ending: RegenerateTotals | ServerGone,
    status: int,
    files: list[str],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
) -> None:
    def run(_options: RegenerateOptions, progress: object) -> RegenerateTotals:
        if isinstance(ending, ServerGone):
            raise ending
        return ending

    monkeypatch.setattr(regenerate_module, "regenerate", run)
    assert data_main(["regenerate", *SERVER, "--model", "x", *files]) == status
    if isinstance(ending, ServerGone):
        assert "ringtrain-data: error: every server refused" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["prepare", "--tokenizer", "t", "--input", "i", "--output", "o", "--workers", "0"],
         "--workers: must be 1 or more, got 0"),
        (["inspect", "d", "--block-size", "0"], "--block-size: must be 1 or more, got 0"),
        (["regenerate", "--local", "m", "--input", "i", "--output", "o", "--batch-size", "0"],
         "--batch-size: must be 1 or more, got 0"),
        (["regenerate", "--local", "m", "--input", "i", "--output", "o", "--threads", "-2"],
         "--threads: must be 1 or more, got -2"),
        (["regenerate", *SERVER, "--model", "x", "--input", "i", "--output", "o",
          "--chat-template-kwargs", "[1]"], "--chat-template-kwargs: must be a JSON object"),
        (["synthesize", "--target", "t", "--output", "o", "--num", "1",
          "--chat-template-kwargs", "{x"], "--chat-template-kwargs: not valid JSON"),
    ],
)  # fmt: skip
def test_argparse_refuses_a_bad_value_naming_the_option(
    arguments: list[str], message: str, capsys: pytest.CaptureFixture
) -> None:
    with pytest.raises(SystemExit) as refusal:
        data_main(arguments)
    assert refusal.value.code == 2
    assert message in capsys.readouterr().err
