"""The toy recipe's closing report: goals and BENCHMARKS lines from a recipe result.

The report is printed by the recipe script itself (``--report`` on a saved result), as a
user reprints the closing table of a finished run.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.helpers.launcher import run_env

ROOT = Path(__file__).resolve().parents[1]
COMMAND = "launch/toy_recipe.sh --device cuda"


def _printed(report: dict, tmp_path: Path) -> list[str]:
    """The closing report that ``toy_recipe.py --report`` prints for ``report``."""
    path = tmp_path / "toy_recipe.json"
    path.write_text(json.dumps({**report, "command": COMMAND}))
    proc = subprocess.run(
        [sys.executable, "-m", "tools.recipes.toy_recipe", "--report", str(path)],
        cwd=ROOT, env=run_env(), capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return proc.stdout.splitlines()


def _section(lines: list[str], title: str) -> list[str]:
    """The lines after ``title`` up to the next blank line."""
    start = lines.index(title) + 1
    end = lines.index("", start) if "" in lines[start:] else len(lines)
    return lines[start:end]


def _eval(tau: float, ties: int = 0, mismatches: int = 0) -> dict:
    return {
        "tau_real": tau, "prompts": 64, "numerical_ties": ties, "lossless": not mismatches,
        "mismatches": [{"prompt": 3, "position": 7, "margin": 2.0}] * mismatches,
        "tie_rule": "bfloat16: ...", "exit": 1 if mismatches else 0,
    }  # fmt: skip


def _report(**objectives: dict) -> dict:
    return {
        "device": "cuda", "machine": "NVIDIA H200", "date": "2026-12-01",
        "timings_s": {"target": 180.0, "train_decayed_ce": 150.0, "total": 590.0},
        "objectives": objectives,
    }  # fmt: skip


def test_goals_and_benchmark_lines(tmp_path: Path) -> None:
    report = _report(
        decayed_ce={
            "held_out": {"tau_sim": 4.9, "tau_uniform": 8.0},
            "eval": {"bfloat16": _eval(5.1, ties=2), "float32": _eval(5.12)},
        },
        dpace={
            "held_out": {"tau_sim": 4.0},
            "eval": {"bfloat16": _eval(4.2, mismatches=1), "float32": _eval(4.3)},
        },
    )
    printed = _printed(report, tmp_path)
    goals = _section(printed, "goals:")
    assert goals[0].startswith("decayed_ce: tau_real (bfloat16) >= 5.0 with 0 mismatches: yes")
    assert "tau_sim within 5%: yes (-3.9%)" in goals[0]
    assert "NO (4.200, 1 mismatches)" in goals[1]
    assert goals[2] == "recipe <= 600 s: yes (590 s)"
    lines = _section(printed, "BENCHMARKS.md lines:")
    assert lines[0].startswith("- tau_real_gpu: 5.100 (NVIDIA H200, 2026-12-01, `launch/")
    assert "float32 5.120, lossless" in lines[0]
    assert lines[1].startswith("- tau_sim_gpu: 4.900") and lines[2].startswith(
        "- numerical_ties_gpu: 2"
    )
    assert lines[-2:][0].startswith("- tau_real_gpu_decayed_ce: 5.100")
    assert lines[-1].startswith("- tau_real_gpu_dpace: 4.200")
    assert printed[-1] == lines[-1]


def test_a_failed_evaluation_is_reported_not_raised(tmp_path: Path) -> None:
    report = _report(decayed_ce={"held_out": {}, "eval": {"bfloat16": {"error": "exit 2"}}})
    printed = _printed(report, tmp_path)
    assert _section(printed, "goals:")[0] == "decayed_ce: evaluation failed: exit 2"
    assert _section(printed, "BENCHMARKS.md lines:") == ["(none: the evaluation failed)"]
    assert "ringtrain-eval" not in "\n".join(printed)
