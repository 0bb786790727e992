"""The toy recipe end to end: make_toy_target -> regenerate -> torchrun training -> eval."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from safetensors.torch import load_file
from transformers import AutoTokenizer

from tests.helpers.at_once import run_at_once
from tests.helpers.launcher import RUN_TIMEOUT_S, run_env, step_records
from tests.helpers.untrained_drafter import write_untrained_drafter

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow
# What 12 steps must add to an untrained drafter's tau_real on the held-out prompts (the toy
# target's continuations are regular: the trained drafter reaches about 10, an untrained one 1).
LEARNED_TAU = 2.0


def _run(command: list[str]) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        command,
        cwd=ROOT,
        env=run_env(),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc


def _make_target_command(output: Path, steps: int) -> list[str]:
    """make_toy_target's arguments after python."""
    module = "tools.recipes.make_toy_target"
    return ["-m", module, "--output", str(output), "--tiny", "--steps", str(steps)]


def _make_target(output: Path, steps: int) -> None:
    _run([sys.executable, *_make_target_command(output, steps)])


def _regenerate_command(
    target: Path, prompts: Path, output: Path, count: int, split: str
) -> list[str]:
    """The regenerate recipe's arguments after python."""
    return [
        "-m", "tools.recipes.regenerate",
        "--target", str(target),
        "--make-prompts", str(count), "--prompt-len", "16", "--split", split,
        "--prompts", str(prompts),
        "--output", str(output),
        "--max-new-tokens", "48",
        "--batch-size", "32",
        "--device", "cpu",
    ]  # fmt: skip


def _run_all(commands: dict[str, list[str]]) -> None:
    """Independent commands (arguments after python), all at once; each must exit 0."""
    for proc in run_at_once(commands, ROOT, run_env(), RUN_TIMEOUT_S).values():
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]


def test_toy_target_is_deterministic_and_has_a_mask_token(tmp_path: Path) -> None:
    _run_all({name: _make_target_command(tmp_path / name, steps=3) for name in ("a", "b")})
    first = load_file(str(tmp_path / "a" / "model.safetensors"))
    second = load_file(str(tmp_path / "b" / "model.safetensors"))
    assert first.keys() == second.keys()
    assert all(first[k].equal(second[k]) for k in first)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "a")
    config = json.loads((tmp_path / "a" / "config.json").read_text())
    assert tokenizer.mask_token_id == config["vocab_size"] - 1 == len(tokenizer) - 1
    text = "def main():\n    return 0\n"
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_recipe_end_to_end_is_lossless(tmp_path: Path) -> None:
    target = tmp_path / "target"
    _make_target(target, steps=30)
    train_prompts, eval_prompts = tmp_path / "train.jsonl", tmp_path / "eval.jsonl"
    _run_all(
        {
            "train": _regenerate_command(target, train_prompts, tmp_path / "train", 64, "train"),
            "eval": _regenerate_command(target, eval_prompts, tmp_path / "eval", 6, "eval"),
        }
    )
    train_text = {json.loads(line)["prompt"] for line in train_prompts.read_text().splitlines()}
    eval_lines = eval_prompts.read_text().splitlines()
    assert len(eval_lines) == 6
    assert not train_text & {json.loads(line)["prompt"] for line in eval_lines}
    table = pa.ipc.open_file(next((tmp_path / "train").glob("*.arrow"))).read_all()
    ids, mask = table.column("input_ids")[0].as_py(), table.column("loss_mask")[0].as_py()
    assert mask == [0] * 16 + [1] * (len(ids) - 16)
    run_dir = tmp_path / "run"
    _run(
        [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", "2", "-m", "ringtrain.main",
            "--config", str(ROOT / "configs" / "toy.toml"),
            "--set", f"run.run_dir={json.dumps(str(run_dir))}",
            "--set", f"target.path={json.dumps(str(target))}",
            "--set", f"data.path={json.dumps(str(tmp_path / 'train'))}",
            "--set", f"data.eval_path={json.dumps(str(tmp_path / 'eval'))}",
            "--set", "run.max_steps=12",
            "--set", "run.checkpoint_every=0",
            "--set", "run.name=toytest",
        ]
    )  # fmt: skip
    assert [r["step"] for r in step_records(run_dir)] == list(range(1, 13))
    result = _evaluate(target, run_dir, eval_prompts)
    assert result["lossless"] and result["prompts"] == 6
    assert result["block_size"] == 16
    assert result["generated_tokens"] == 6 * 32
    untrained = write_untrained_drafter(run_dir, target, tmp_path / "untrained")
    baseline = _evaluate(target, untrained, eval_prompts)
    assert baseline["lossless"] and baseline["generated_tokens"] == 6 * 32
    assert result["tau_real"] > baseline["tau_real"] + LEARNED_TAU, (result, baseline)


def _evaluate(target: Path, drafter: Path, prompts: Path) -> dict:
    """ringtrain-eval's JSON report of `drafter` on `prompts`, 32 new tokens each."""
    proc = _run(
        [
            sys.executable, "-m", "ringtrain.cli.eval",
            "--target", str(target),
            "--drafter", str(drafter),
            "--prompts", str(prompts),
            "--max-new-tokens", "32",
            "--device", "cpu",
            "--threads", "1",
            "--json",
        ]
    )  # fmt: skip
    return json.loads(proc.stdout.strip().splitlines()[-1])
