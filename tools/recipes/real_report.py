"""The real-model recipes' report: the machine, the closing summary (the timings, with
the steps an earlier call made; tau per training-set size; tau and speedup per
benchmark) and its BENCHMARKS.md lines, and the JSON written to $OUT and the run."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tools.recipes.real_eval import benchmark_lines, benchmark_rows


def machine_name(device: str) -> str:
    """The GPU's name, or "CPU"."""
    if device != "cuda":
        return "CPU"
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CUDA (not visible)"


def size_rows(report: dict) -> list[str]:
    """The table of tau against the number of training prompts."""
    rows = [f"{'train prompts':>14} {'tau_sim':>8} {'tau_real':>9} {'train tok/s':>12}"]
    for size, entry in sorted(report["sizes"].items()):
        result = next(iter(entry["eval"].values()))
        tau_real = f"{result['tau_real']:.3f}" if "tau_real" in result else "-"
        tau_sim = entry["held_out"].get("tau_sim")
        rate = entry["train_tokens_per_s"]
        rows.append(
            f"{size:>14} {'-' if tau_sim is None else f'{tau_sim:.3f}':>8} {tau_real:>9} "
            f"{'-' if rate is None else f'{rate:,.0f}':>12}"
        )
    return rows


def summary(report: dict, title: str, rows: list[str], benchmarks: list[str]) -> str:
    """A real-model recipe's closing summary: its title, machine and date, the timings,
    its table ``rows`` and its BENCHMARKS.md lines."""
    lines = [f"{title} on {report['machine']} ({report['device']}), {report['date']}"]
    earlier = report.get("earlier_s", {}).items()
    lines += [f"{name:<24}{seconds:>10.1f}  (an earlier call)" for name, seconds in earlier]
    lines += [f"{name:<24}{seconds:>10.1f}" for name, seconds in report["timings_s"].items()]
    return "\n".join([*lines, "", *rows, "", "BENCHMARKS.md lines:", *benchmarks])


def recipe_lines(report: dict, command: str) -> list[str]:
    """BENCHMARKS.md lines (`- metric: value (machine, date, command)`): the largest set's
    evaluations, its held-out tau_sim, the regeneration's rate and the recipe's time."""
    where = f"{report['machine']}, {report['date']}, `{command}`"
    entry = report["sizes"][max(report["sizes"])]
    lines = benchmark_lines(report, where)
    tau_sim = entry["held_out"].get("tau_sim")
    if tau_sim is not None:
        lines.append(f"- tau_sim_humaneval: {tau_sim:.3f} ({where}; held-out, last step)")
    regen = report["regenerate"]
    lines.append(
        f"- regen_tokens_per_s: {regen['tokens_per_s']} ({where}; {regen['prompts']} prompts, "
        f"{regen['new_tokens']} tokens, {regen['truncated']} cut at the limit)"
    )
    lines.append(real_recipe_seconds_line(report, where))
    return lines


def real_recipe_seconds_line(report: dict, where: str) -> str:
    """The BENCHMARKS.md line of the recipe's whole time (real_recipe_gpu_s on CUDA,
    real_recipe_cpu_s on the CPU): this run's, plus the seconds of the steps it reused as
    the earlier calls that made them measured them."""
    timings, earlier = report["timings_s"], report.get("earlier_s", {})
    steps = [f"{k} {v:.0f} (an earlier call)" for k, v in earlier.items()]
    steps += [f"{k} {v:.0f}" for k, v in timings.items() if k != "total"]
    total = timings["total"] + sum(earlier.values())
    kind = "gpu" if report["device"] == "cuda" else "cpu"
    return f"- real_recipe_{kind}_s: {total:.0f} ({where}; {', '.join(steps)})"


def table(report: dict, command: str) -> str:
    """The closing summary: timings, tau per training-set size, tau and speedup per
    benchmark of the largest set's drafter, BENCHMARKS lines."""
    evals = report["sizes"][max(report["sizes"])]["eval"]
    rows = [*size_rows(report), "", *benchmark_rows(evals)]
    return summary(report, "real-model recipe", rows, recipe_lines(report, command))


def save_json(report: dict, filename: str, run_dir: Path) -> None:
    """Write a recipe's results as `filename` into $OUT (when set) and `run_dir`."""
    text = json.dumps(report, indent=2) + "\n"
    for directory in (os.environ.get("OUT"), run_dir):
        if directory:
            Path(directory).mkdir(parents=True, exist_ok=True)
            (Path(directory) / filename).write_text(text)
