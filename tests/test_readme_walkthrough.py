"""docs/training.md, "Training your own drafter", walked on a tiny chat model written with
save_pretrained: regenerate --local, prepare, inspect (and --row), train, stop, resume,
eval and plot, each a real command that exits 0 and prints what the page says; and
launch/single_node.sh as the page runs it, in a shell whose python3 is not the project's
(the launch scripts find the project's environment themselves)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from ringtrain.target.tiny import build_tiny_target
from tests.helpers.launcher import RUN_TIMEOUT_S, run_env, step_records, wait_for_step
from tests.helpers.untrained_drafter import write_untrained_drafter

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
PROJECT = Path(__file__).resolve().parents[1]
# What the 30 steps must add to an untrained drafter's tau_real on the chats (measured:
# 5.13 against 1.00).
LEARNED_TAU = 2.0
CHATS = [
    {"messages": [{"role": "user", "content": f"question {i}: tell me about rings"}]}
    for i in range(6)
]
CONFIG = """
[run]
name = "walk{pid}"
run_dir = "{root}/runs/walk"
device = "cpu"
max_steps = 30
log_every = 1
eval_every = 30
checkpoint_every = 30

[layout]
targets_per_node = 1
drafters_per_node = 1

[data]
path = "{root}/data/train"
eval_path = "{root}/data/train"
token_budget = 256
max_len = 128
bucket = 16

[target]
path = "{root}/models/chat"
num_taps = 2

[drafter]
num_layers = 1
block_size = 8
num_anchors = 8
anchor_ref_len = 64
compile = false

[optim]
lr = 1e-2
"""


def run(root: Path, *command: str) -> str:
    """A command of docs/training.md, run from `root`; its output, after checking it exited 0."""
    proc = subprocess.run(
        command, cwd=root, env=run_env(), capture_output=True, text=True, timeout=RUN_TIMEOUT_S
    )
    assert proc.returncode == 0, (
        f"{command} exited {proc.returncode}:\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}"
    )
    return proc.stdout + proc.stderr


def train_command(*flags: str) -> list[str]:
    """Step 3's command by hand (`ringtrain-launch`, as `python -m ringtrain.launch`)."""
    return [
        sys.executable, "-m", "ringtrain.launch", "--standalone", "--nproc-per-node", "2",
        "--config", "walk.toml", *flags,
    ]  # fmt: skip


def writes_printable_ascii(model: Path) -> None:
    """Zero the LM head's rows of every token but the printable ASCII bytes, so that the
    random model writes only those (a zero logit never beats the largest of 95 random
    ones). Its answers then survive regenerate's text: a lone byte of a multi-byte
    character, or a filler token, reads back as other tokens, and a drafter trained on
    those could not be measured on what the target writes when served."""
    weights = load_file(model / "model.safetensors")
    head = weights["lm_head.weight"]
    keep = head[ord(" ") : ord("~") + 1].clone()
    head.zero_()
    head[ord(" ") : ord("~") + 1] = keep
    save_file(weights, str(model / "model.safetensors"), metadata={"format": "pt"})


def prepared_dataset(root: Path) -> None:
    """Step 1 of docs/training.md: regenerate the chats with the target, prepare and inspect."""
    build_tiny_target(root / "models" / "chat", hybrid=False, num_layers=6, hidden_size=32)
    writes_printable_ascii(root / "models" / "chat")
    (root / "chats.jsonl").write_text("".join(json.dumps(c) + "\n" for c in CHATS))
    out = run(
        root, str(BIN / "ringtrain-data"), "regenerate", "--local", "models/chat",
        "--input", "chats.jsonl", "--output", "data/regenerated.jsonl", "--max-tokens", "40",
        "--no-progress",
    )  # fmt: skip
    assert "6 records regenerated" in out and "answers cut at --max-tokens" in out
    out = run(
        root, str(BIN / "ringtrain-data"), "prepare", "--tokenizer", "models/chat",
        "--input", "data/regenerated.jsonl", "--output", "data/train", "--block-size", "8",
    )  # fmt: skip
    assert "6 samples" in out and "training will drop them" in out
    out = run(root, str(BIN / "ringtrain-data"), "inspect", "data/train", "--block-size", "8")
    assert "rows" in out
    out = run(
        root, str(BIN / "ringtrain-data"), "inspect", "data/train", "--row", "0",
        "--tokenizer", "models/chat",
    )  # fmt: skip
    assert "question 0: tell me about rings" in out and "⟦" in out and "⟧" in out


@pytest.fixture(scope="module")
def walk_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory with step 1 of docs/training.md done (the tiny chat model, its chats, the
    prepared dataset) and step 2's config, walk.toml."""
    root = tmp_path_factory.mktemp("walk")
    prepared_dataset(root)
    (root / "walk.toml").write_text(CONFIG.format(root=root, pid=os.getpid()))
    return root


def trained_stopped_and_resumed(root: Path) -> Path:
    """Steps 3-4 of docs/training.md: a launch stopped with SIGTERM, then --resume."""
    run_dir = root / "runs" / "walk"
    output = root / "train.out"
    with output.open("wb") as sink:
        proc = subprocess.Popen(
            train_command(), cwd=root, env=run_env(), stdout=sink, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    try:
        wait_for_step(proc, run_dir, 2, output.read_text)
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(RUN_TIMEOUT_S) == 0, output.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    out = output.read_text()
    assert "tok/s" in out and "loss" in out, out[-3000:]
    stopped = step_records(run_dir)[-1]["step"]
    assert f"stopped at step {stopped} (SIGTERM), checkpoint" in out and "resume with" in out
    assert stopped < 30 and any((run_dir / "checkpoints").iterdir())
    drafter_log = run_dir / "logs" / "rank1-drafter.log"
    assert "exiting with code 0" in drafter_log.read_text()
    run(root, *train_command("--resume"))
    assert f"resumed from {run_dir / 'checkpoints'}" in drafter_log.read_text()
    assert f"at step {stopped}; schedule: step {stopped} of 30" in drafter_log.read_text()
    assert [r["step"] for r in step_records(run_dir)] == list(range(1, 31))
    return run_dir


def evaluated(root: Path, drafter: str) -> dict:
    """Step 5's evaluation of `drafter` on the chats: ringtrain-eval's JSON report."""
    out = run(
        root, str(BIN / "ringtrain-eval"), "--target", "models/chat", "--drafter", drafter,
        "--prompts", "chats.jsonl", "--max-new-tokens", "32", "--device", "cpu", "--json",
    )  # fmt: skip
    assert "tau_real" in out, out[-3000:]
    return json.loads(next(line for line in reversed(out.splitlines()) if line.startswith("{")))


def test_the_readme_walkthrough_runs_as_written(walk_root: Path) -> None:
    run_dir = trained_stopped_and_resumed(walk_root)
    trained = evaluated(walk_root, "runs/walk")
    write_untrained_drafter(run_dir, walk_root / "models" / "chat", walk_root / "untrained")
    untrained = evaluated(walk_root, "untrained")
    assert trained["tau_real"] > untrained["tau_real"] + LEARNED_TAU, (trained, untrained)
    run(walk_root, str(BIN / "ringtrain-plot"), str(run_dir), "-o", "run.png")
    assert (walk_root / "run.png").read_bytes()[:4] == b"\x89PNG"


def as_a_set_up_clone(root: Path) -> None:
    """Make `root` look like the project's root after tools/setup_env.sh, by symlinks:
    its launch/ scripts and package, and .venv (the environment running this suite)."""
    for name in ("launch", "ringtrain"):
        (root / name).symlink_to(PROJECT / name, target_is_directory=True)
    (root / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)


def shell_without_the_project() -> dict[str, str]:
    """A shell's environment in which neither python3 nor PYTHONPATH is the project's:
    the venv's bin/ off PATH, no VIRTUAL_ENV, PYTHONPATH or PYTHONHOME."""
    env = {
        k: v for k, v in run_env().items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")
    }
    env["PATH"] = os.pathsep.join(
        d for d in env.get("PATH", "").split(os.pathsep) if d and Path(d).resolve() != BIN.resolve()
    )
    python3 = shutil.which("python3", path=env["PATH"])
    assert python3 is None or Path(python3).resolve() != Path(sys.executable).resolve()
    return env


def test_single_node_sh_runs_as_written_in_a_shell_without_the_project(walk_root: Path) -> None:
    """Step 3's `launch/single_node.sh CONFIG`: launch/python.sh finds .venv at the
    project root, single_node.sh takes --nproc-per-node from [layout] (1 target + 1
    drafter), and the run prints step 4's progress lines and end-of-run role split."""
    as_a_set_up_clone(walk_root)
    command = ["launch/single_node.sh", "walk.toml", "--set", "run.max_steps=3"]
    command += ["--set", "run.run_dir=runs/single", "--set", "run.eval_every=0"]
    proc = subprocess.run(
        command, cwd=walk_root, env=shell_without_the_project(), capture_output=True,
        text=True, timeout=RUN_TIMEOUT_S,
    )  # fmt: skip
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    progress = next(line for line in out.splitlines() if "step 3/3 |" in line)
    for figure in ("tau_sim", "tok/s", "loss", "tau_uniform", "ring", "occupied"):
        assert figure in progress, progress
    assert "role split over the node's 2 processes" in out and "min(1 x " in out, out[-3000:]
    run_dir = walk_root / "runs" / "single"
    assert [r["step"] for r in step_records(run_dir)] == [1, 2, 3]
    logs = sorted(log.name for log in (run_dir / "logs").glob("rank*.log"))
    assert logs == ["rank0-target.log", "rank1-drafter.log"]
