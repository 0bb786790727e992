"""ringtrain-eval end to end on a tiny target with an untrained DFlash drafter."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ringtrain.cli.eval import main
from ringtrain.target.tiny import build_tiny_target
from tests.helpers.eval_drafters import write_drafter

pytestmark = pytest.mark.usefixtures("one_thread")


def write_prompts(path: Path) -> Path:
    lines = [
        {"prompt": "def main():\n    return"},
        {"input_ids": [5, 17, 99, 3, 250, 41]},
        {"prompt": "import os"},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def tiny_evaluation(tmp_path: Path, hybrid: bool = True) -> tuple[Path, Path, Path]:
    """The tiny target (seed 1; hybrid unless told), an untrained drafter for it and the
    three prompts."""
    target = build_tiny_target(tmp_path / "target", seed=1, hybrid=hybrid)
    return (
        target,
        write_drafter(tmp_path / "drafter", target),
        write_prompts(tmp_path / "prompts.jsonl"),
    )


@pytest.mark.parametrize("hybrid", [False, True], ids=["dense", "hybrid"])
def test_untrained_drafter_is_lossless_with_tau_near_one(
    tmp_path: Path, hybrid: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    target, drafter, prompts = tiny_evaluation(tmp_path, hybrid)
    code = main(
        [
            "--target", str(target),
            "--drafter", str(drafter),
            "--prompts", str(prompts),
            "--max-new-tokens", "24",
            "--device", "cpu",
            "--json",
        ]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    result = json.loads(out.strip().splitlines()[-1])
    assert result["lossless"] and result["mismatches"] == []
    assert result["numerical_ties"] == 0 and result["tie_rule"].startswith("exact (float32")
    assert result["prompts"] == 3
    assert 1.0 <= result["tau_real"] < 1.5
    assert len(result["acceptance"]) == 7
    assert result["generated_tokens"] == 3 * 24
    # Each prompt's first token comes from its prompt's forward, the other 23 from the
    # verification forwards, of which the last may overshoot by up to 7 drafts.
    gained = result["tau_real"] * result["verify_forwards"]
    assert 3 * 23 <= round(gained) <= 3 * (23 + 7)
    assert gained == pytest.approx(round(gained))
    assert result["tau_real"] == pytest.approx(1 + sum(result["acceptance"]))
    assert result["speculative_tokens_per_s"] > 0 and result["greedy_tokens_per_s"] > 0
    rates = result["speculative_tokens_per_s"] / result["greedy_tokens_per_s"]
    assert result["speedup"] == pytest.approx(rates)
    assert "tau_real" in out


def test_drafter_of_another_target_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = build_tiny_target(tmp_path / "target", seed=1, hybrid=False)
    other = build_tiny_target(tmp_path / "other", seed=1, hybrid=False, vocab_size=600)
    drafter = write_drafter(tmp_path / "drafter", other)
    prompts = write_prompts(tmp_path / "prompts.jsonl")
    code = main(["--target", str(target), "--drafter", str(drafter), "--prompts", str(prompts)])
    assert code == 2
    assert "vocab_size = 600" in capsys.readouterr().err


def test_bad_prompt_line_names_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = build_tiny_target(tmp_path / "target", seed=1, hybrid=False)
    drafter = write_drafter(tmp_path / "drafter", target)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "x"}\n{"text": "y"}\n')
    code = main(["--target", str(target), "--drafter", str(drafter), "--prompts", str(prompts)])
    assert code == 2
    assert f"{prompts}:2" in capsys.readouterr().err


def test_workers_decode_shares_with_the_same_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target, drafter, prompts = tiny_evaluation(tmp_path)
    results = []
    for workers in ("1", "2"):
        code = main(
            [
                "--target", str(target), "--drafter", str(drafter),
                "--prompts", str(prompts), "--max-new-tokens", "12",
                "--device", "cpu", "--threads", "1", "--workers", workers, "--json",
            ]
        )  # fmt: skip
        out = capsys.readouterr().out
        assert code == 0, out
        results.append(json.loads(out.strip().splitlines()[-1]))
    single, shared = results
    for key in ("prompts", "generated_tokens", "verify_forwards", "tau_real", "acceptance"):
        assert shared[key] == single[key], key


def test_several_temperatures_in_one_run_give_each_one_s_own_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--temperature 0 --temperature 1: one run (its workers load the models once) reports
    at each temperature exactly what a run at that temperature alone reports."""
    target, drafter, prompts = tiny_evaluation(tmp_path)
    common = [
        "--target", str(target), "--drafter", str(drafter), "--prompts", str(prompts),
        "--max-new-tokens", "8", "--device", "cpu", "--threads", "1", "--json",
    ]  # fmt: skip

    def run(*extra: str) -> dict:
        code = main([*common, *extra])
        out = capsys.readouterr().out
        assert code == 0, out
        return json.loads(out.strip().splitlines()[-1])

    together = run("--temperature", "0", "--temperature", "1", "--workers", "2")
    alone = [run(), run("--temperature", "1")]
    assert [e["temperature"] for e in together["evaluations"]] == [0.0, 1.0]
    assert [e["lossless"] for e in together["evaluations"]] == [True, None]
    for mixed, single in zip(together["evaluations"], alone, strict=True):
        for key in ("prompts", "generated_tokens", "verify_forwards", "tau_real", "acceptance"):
            assert mixed[key] == single[key], (single["temperature"], key)


def test_answers_as_long_as_the_target_s_context_are_refused_before_loading(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target, drafter, prompts = tiny_evaluation(tmp_path)
    config = json.loads((target / "config.json").read_text())
    config["max_position_embeddings"] = context = 16  # short: a run past the check ends soon
    (target / "config.json").write_text(json.dumps(config))
    common = ["--target", str(target), "--drafter", str(drafter), "--prompts", str(prompts)]
    assert main([*common, "--max-new-tokens", str(context), "--device", "cpu"]) == 2
    assert (
        f"--max-new-tokens {context} does not fit the target's context" in capsys.readouterr().err
    )
