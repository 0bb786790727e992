"""Start-up refusals through real torchrun: nonsensical values and an unwritable run
directory fail in pre-flight, once, naming the key, exit 2; the embedded default runs
with any process count from 2 and derives its role split."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ringtrain.config import ConfigError, parse_config
from ringtrain.main import embedded_split, main
from tests.launcher import RUN_TIMEOUT_S, run_env


def embedded_run(processes: int, run_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    """The README's headline command on the embedded default, with overrides."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += [f"--nproc-per-node={processes}", "-m", "ringtrain.main"]
    command += ["--set", f"run.run_dir={json.dumps(str(run_dir))}", "--set", 'run.device="cpu"']
    for item in overrides:
        command += ["--set", item]
    return subprocess.run(
        command, env=run_env(), capture_output=True, text=True, timeout=RUN_TIMEOUT_S
    )


@pytest.mark.parametrize(
    ("processes", "targets", "drafters"), [(2, 1, 1), (3, 2, 1), (4, 3, 1), (8, 5, 3)]
)
def test_embedded_split_follows_the_process_count(
    processes: int, targets: int, drafters: int
) -> None:
    assert embedded_split(processes) == [
        f"layout.targets_per_node={targets}",
        f"layout.drafters_per_node={drafters}",
    ]


def test_embedded_default_refuses_one_process() -> None:
    with pytest.raises(ConfigError, match="at least 2 processes per node"):
        embedded_split(1)


def test_nonsensical_value_fails_once_before_anything_starts(tmp_path: Path) -> None:
    """Through torchrun with 4 processes: the refusal is printed once, not 4 times."""
    finished = embedded_run(4, tmp_path / "run", "run.max_steps=0")
    assert finished.returncode != 0
    assert finished.stderr.count("Expected `int` >= 1 - at `$.run.max_steps`") == 1
    assert not (tmp_path / "run").exists()  # refused before anything was written


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("optim.lr=nan", r"optim\.lr = nan must be a finite number > 0"),
        ("optim.lr=inf", r"optim\.lr = inf must be a finite number > 0"),
        ("data.bucket=0", r"Expected `int` >= 1 - at `\$\.data\.bucket`"),
        ("run.log_every=0", r"Expected `int` >= 1 - at `\$\.run\.log_every`"),
    ],
)
def test_nonsensical_values_are_named(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config("", "run.toml", [override])


def test_unwritable_run_dir_is_refused_naming_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for name, value in {"RANK": 0, "LOCAL_RANK": 0, "WORLD_SIZE": 3, "LOCAL_WORLD_SIZE": 3}.items():
        monkeypatch.setenv(name, str(value))
    code = main(["--set", f"run.run_dir={json.dumps(str(blocker / 'run'))}"])
    assert code == 2
    err = capsys.readouterr().err
    assert "run.run_dir = " in err and "cannot be written (Not a directory)" in err


def test_embedded_default_trains_with_two_processes(tmp_path: Path) -> None:
    finished = embedded_run(2, tmp_path / "run", "run.max_steps=4", "run.eval_every=0")
    assert finished.returncode == 0, finished.stderr[-3000:]
    steps = [
        json.loads(line)
        for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
        if '"event": "step"' in line or '"event":"step"' in line
    ]
    assert [record["step"] for record in steps][-1] == 4
    logs = sorted(p.name for p in (tmp_path / "run" / "logs").iterdir())
    assert logs == ["rank0-target.log", "rank1-drafter.log"]
