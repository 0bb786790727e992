"""The README's first command, `bash launch/quickstart.sh`, run as a user runs it: it sets
up (here: finds) the environment, trains the embedded default and ends by naming the
drafter and the next commands, and the evaluation command it prints works."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VENV = Path(sys.prefix)

pytestmark = pytest.mark.slow


def _environment_made_by_setup() -> bool:
    """The quickstart installs into its environment unless tools/setup_env.sh made it and
    pyproject.toml is unchanged since: only then may a test run it against this one."""
    stamp = VENV / ".ringtrain-installed"
    return stamp.is_file() and stamp.stat().st_mtime >= (ROOT / "pyproject.toml").stat().st_mtime


@pytest.mark.skipif(
    not _environment_made_by_setup(), reason="the test environment was not made by setup_env"
)
def test_quickstart_trains_and_its_next_command_evaluates(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "tiny"
    env = {**os.environ, "RINGTRAIN_VENV": str(VENV)}
    settings = [
        f'run.run_dir="{run_dir}"', "run.max_steps=4", "run.eval_every=4",
        "run.checkpoint_every=4", "run.log_every=2",
    ]  # fmt: skip
    command = ["bash", str(ROOT / "launch" / "quickstart.sh")]
    for setting in settings:
        command += ["--set", setting]
    proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert any("held-out after step 4: tau_sim" in line for line in lines)
    (drafter_line,) = [line for line in lines if line.startswith("drafter: ")]
    checkpoint = Path(drafter_line.split()[1])
    assert checkpoint == run_dir / "checkpoints" / "step_00000004"
    assert (checkpoint / "model.safetensors").is_file()
    evaluate = next(line.strip() for line in lines if "ringtrain-eval --target" in line)
    proc = subprocess.run(
        shlex.split(evaluate), cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "tau_real" in proc.stdout + proc.stderr
