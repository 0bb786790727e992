"""The real-model recipes' evaluation: ringtrain-eval per drafter, dtype and temperature.

Each evaluation scores one drafter on every benchmark of the recipe's ``benchmarks``
(HumanEval, MT-Bench both turns, ...) as served (the model's chat template), greedy at
temperature 0 (checked token for token against plain greedy decoding) or with the
speculative sampling rule at a temperature; one ringtrain-eval run makes a dtype's
evaluations at every temperature (the workers load the models once). The JSON of each
evaluation is kept beside the drafter (``eval-<dtype>[-t<T>].json``) so a recipe stopped
later loses none.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tools.recipes.children import run_all
from tools.recipes.mps import mps_daemon
from tools.recipes.real_base import RealRecipe, log


def evaluates_under_mps(recipe: RealRecipe) -> bool:
    """On CUDA, with ``eval_mps`` and more than one worker process."""
    settings = recipe.settings
    return recipe.device == "cuda" and settings.eval_mps and settings.eval_workers > 1


def eval_key(dtype: str, temperature: float) -> str:
    """The name of one evaluation: its dtype, and its temperature where above 0."""
    return dtype if temperature == 0 else f"{dtype}-t{temperature:g}"


def eval_command(
    recipe: RealRecipe, drafter: Path, dtype: str, limit: int, temperatures: list[float]
) -> list[str]:
    """ringtrain-eval on the recipe's benchmarks (the first `limit` prompts of each; 0: all)
    for one drafter (a run directory) and dtype, at each of ``temperatures``."""
    settings = recipe.settings
    first = ["--limit", str(limit)] if limit else []
    benchmarks = [arg for name in settings.benchmarks for arg in ("--benchmark", name)]
    sampling = [arg for t in temperatures for arg in ("--temperature", f"{t:g}")]
    return [
        sys.executable, "-m", "ringtrain.cli.eval",
        "--target", str(recipe.target), "--drafter", str(drafter),
        *benchmarks, *first, *sampling,
        "--max-new-tokens", str(settings.eval_max_new_tokens),
        "--device", recipe.device, "--dtype", dtype, "--json",
        "--workers", str(settings.eval_workers),
    ]  # fmt: skip


def evaluate_drafter(
    recipe: RealRecipe,
    drafter: Path,
    dtype: str,
    limit: int,
    temperatures: list[float],
    reuse: bool = False,
) -> dict[str, dict]:
    """ringtrain-eval's JSON for one drafter and dtype at each of ``temperatures`` (one
    run), by eval_key; each with the run's exit status and command beside (or an error),
    and kept as `drafter`/eval-<key>.json. ``reuse``: the drafter is the one those files
    scored, so files that an earlier run of the same command wrote without an error are
    returned instead of evaluating again."""
    keys = [eval_key(dtype, t) for t in temperatures]
    name = f"eval_{drafter.name}_{'_'.join(keys)}"
    command = eval_command(recipe, drafter, dtype, limit, temperatures)
    files = [drafter / f"eval-{key}.json" for key in keys]
    if reuse and all(file.is_file() for file in files):
        earlier = [json.loads(file.read_text()) for file in files]
        if all(e.get("command") == command[1:] and "error" not in e for e in earlier):
            log(f"{name}: reusing {', '.join(file.name for file in files)}")
            return dict(zip(keys, earlier, strict=True))
    with mps_daemon(evaluates_under_mps(recipe)):
        proc = run_all({name: command}, recipe.root)[name]
    lines = proc.stdout.strip().splitlines()
    found = json.loads(lines[-1]) if proc.returncode in (0, 1) and lines else None
    evaluations = found.get("evaluations", [found]) if found else []
    results = {}
    error = {"error": f"ringtrain-eval exit {proc.returncode}"}
    for key, file, evaluation in zip(keys, files, evaluations or [error] * len(keys), strict=True):
        results[key] = {**evaluation, "exit": proc.returncode, "command": command[1:]}
        file.write_text(json.dumps(results[key]) + "\n")
    return results


def evaluate(recipe: RealRecipe) -> dict[int, dict[str, dict]]:
    """ringtrain-eval's JSON per training-set size and evaluation (dtype, temperature).

    The largest set's drafter is scored in the first dtype at every temperature (one run)
    and in each other dtype at temperature 0; the other sizes in the first dtype, greedy.
    One run at a time: each already spreads its prompts over ``eval_workers`` processes,
    and more processes than CPU cores slow every one of them down.
    """
    settings = recipe.settings
    dtypes = settings.eval_dtypes
    temperatures = [0.0, *(t for t in settings.temperatures if t > 0)]
    results: dict[int, dict[str, dict]] = {}
    for size in sorted(settings.train_prompts, reverse=True):
        if size == recipe.largest:
            runs = [(dtypes[0], temperatures), *((dtype, [0.0]) for dtype in dtypes[1:])]
        else:
            runs = [(dtypes[0], [0.0])]
        for dtype, chosen in runs:
            results.setdefault(size, {}).update(
                evaluate_drafter(recipe, recipe.run_dir(size), dtype, settings.eval_limit, chosen)
            )
    return results


def benchmark_rows(evals: dict[str, dict]) -> list[str]:
    """One row per benchmark (and category) and evaluation: tau and speedup per stream."""
    rows = [f"{'benchmark':<28} {'evaluation':<16} {'tau':>7} {'speedup':>8} {'turns':>6}"]
    for key, result in evals.items():
        for name, figures in result.get("benchmarks", {}).items():
            speedup = figures.get("speedup")
            rows.append(
                f"{name:<28} {key:<16} {figures['tau_real']:>7.3f} "
                f"{'-' if speedup is None else f'{speedup:.2f}x':>8} {figures['prompts']:>6}"
            )
    return rows


def benchmark_metric(benchmark: str) -> str:
    """The BENCHMARKS.md metric of a benchmark's (or category's) tau_real:
    tau_real_humaneval, tau_real_mtbench_math, ..."""
    return f"tau_real_{benchmark.replace('-', '').replace('/', '_')}"


def benchmark_lines(report: dict, where: str) -> list[str]:
    """BENCHMARKS.md lines of the largest set's evaluations (`- metric: value (where)`)."""
    entry = report["sizes"][max(report["sizes"])]
    lines = []
    for key, result in entry["eval"].items():
        if "error" in result:
            continue
        suffix = "" if result.get("temperature", 0) == 0 else f"_t{result['temperature']:g}"
        for name, figures in result.get("benchmarks", {}).items():
            lines.append(
                f"- {benchmark_metric(name)}{suffix} ({key}): {figures['tau_real']:.3f} ({where}; "
                f"{figures['prompts']} turns, speedup {figures.get('speedup') or 0:.2f}x, "
                f"{figures.get('numerical_ties', 0)} ties)"
            )
        if result.get("temperature", 0) == 0:
            lines.append(
                f"- eval_mismatches ({key}): {len(result.get('mismatches', []))} ({where})"
            )
    return lines
