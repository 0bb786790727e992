"""The toy recipe in one command: target, data, drafter training, evaluation, timed.

    # or launch/toy_recipe.sh --device cuda
    python -m tools.recipes.toy_recipe --device cuda
    python -m tools.recipes.toy_recipe --device cuda --objectives decayed_ce,dpace

Steps (sizes from configs/recipes/toy.toml, the section of the device; paths from the
training config it names):
1. target: tools/recipes/make_toy_target.py for ``target_minutes``;
2. data: tools/recipes/regenerate.py carves ``train_prompts`` and ``eval_prompts`` prompts from
   the corpus (the splits share no text) and answers them greedily with the target;
3. training: torchrun ringtrain.main with the training config, once per objective (same
   data, same steps); its held-out evaluation reports tau_sim;
4. evaluation: ringtrain-eval on the held-out prompts in each of ``eval_dtypes``.

A target or dataset made before with the same settings is reused (``--fresh`` remakes
them). Every step's output goes to stderr as it runs; the timings and results are
written as JSON to $OUT/toy_recipe.json (when $OUT is set) and to the run directory,
and a table with the verdict against the recipe's goals is printed last.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

import msgspec

from ringtrain.cli.train_args import add_override_option
from ringtrain.config import Config, load_config

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ROOT / "configs" / "recipes" / "toy.toml"
GOALS = {"tau_real": 5.0, "tau_sim_gap": 0.05, "seconds": 600.0}


class RecipeSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One device's section of configs/recipes/toy.toml."""

    config: str
    target_minutes: float
    # An exact step count for the target (overrides target_minutes); 0: by time.
    target_steps: int = 0
    # Megabytes of corpus text the target trains on; 0: make_toy_target's preset.
    corpus_mb: float = 0.0
    train_prompts: int
    eval_prompts: int
    prompt_len: int = 32
    max_new_tokens: int = 96
    regen_dtype: str = "auto"
    eval_dtypes: list[str] = msgspec.field(default_factory=lambda: ["auto"])


@dataclass
class Recipe:
    """What one recipe run does and where its files go."""

    device: str
    settings: RecipeSettings
    config: Config
    overrides: list[str]
    fresh: bool
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def target(self) -> Path:
        return ROOT / self.config.target.path

    def prompts(self, split: str) -> Path:
        return ROOT / f"{self.dataset(split)}-prompts.jsonl"

    def dataset(self, split: str) -> Path:
        return ROOT / (self.config.data.path if split == "train" else self.config.data.eval_path)

    def run_dir(self, objective: str, compared: bool) -> Path:
        """The config's run directory, suffixed by the objective when it is not the config's."""
        base = ROOT / self.config.run.run_dir
        own = not compared and objective == self.config.drafter.objective
        return base if own else base.with_name(f"{base.name}-{objective}")


def log(message: str) -> None:
    """Recipe progress on stderr."""
    print(f"[toy_recipe] {message}", file=sys.stderr, flush=True)


def run_step(name: str, recipe: Recipe, command: list[str]) -> subprocess.CompletedProcess:
    """Run one child command (output passes through to stderr), timed under ``name``."""
    log(f"{name}: {' '.join(command)}")
    started = time.perf_counter()
    proc = subprocess.run(
        command, cwd=ROOT, stdout=subprocess.PIPE, stderr=sys.stderr, text=True, check=False
    )
    recipe.timings[name] = recipe.timings.get(name, 0.0) + time.perf_counter() - started
    sys.stderr.write(proc.stdout)
    return proc


def checked(proc: subprocess.CompletedProcess, what: str) -> None:
    """Stop the recipe when a step that later steps need failed."""
    if proc.returncode != 0:
        raise SystemExit(f"toy_recipe: {what} failed (exit {proc.returncode}); see the log above")


def make_target(recipe: Recipe) -> None:
    """Step 1, unless a target of these settings exists."""
    settings = recipe.settings
    info = recipe.target / "toy_target.json"
    wanted = {
        "minutes": None if settings.target_steps else settings.target_minutes,
        "corpus_mb": settings.corpus_mb,
        "device": recipe.device,
    }
    if settings.target_steps:
        wanted["steps"] = settings.target_steps
    if not recipe.fresh and info.is_file():
        made = json.loads(info.read_text())
        if {k: made.get(k) for k in wanted} == wanted:
            log(f"target: reusing {recipe.target} ({made['steps']} steps)")
            recipe.timings["target"] = 0.0
            return
    command = [
        sys.executable, "-m", "tools.recipes.make_toy_target",
        "--output", str(recipe.target),
        "--minutes", str(settings.target_minutes),
        "--steps", str(settings.target_steps),
        "--corpus-mb", str(settings.corpus_mb),
        "--device", recipe.device,
    ]  # fmt: skip
    checked(run_step("target", recipe, command), "making the target")


def make_data(recipe: Recipe, split: str) -> None:
    """Step 2 for one split, unless a dataset of these settings exists."""
    settings = recipe.settings
    count = settings.train_prompts if split == "train" else settings.eval_prompts
    made = json.loads((recipe.target / "toy_target.json").read_text())
    stamp = {
        "prompts": count,
        "prompt_len": settings.prompt_len,
        "max_new_tokens": settings.max_new_tokens,
        "target_steps": made["steps"],
        "corpus_bytes": made["preset"]["corpus_bytes"],
    }
    stamp_file = recipe.dataset(split) / "recipe.json"
    if not recipe.fresh and stamp_file.is_file() and json.loads(stamp_file.read_text()) == stamp:
        log(f"data {split}: reusing {recipe.dataset(split)}")
        recipe.timings[f"data_{split}"] = 0.0
        return
    shutil.rmtree(recipe.dataset(split), ignore_errors=True)
    command = [
        sys.executable, "-m", "tools.recipes.regenerate",
        "--target", str(recipe.target),
        "--make-prompts", str(count), "--prompt-len", str(settings.prompt_len),
        "--split", split,
        "--prompts", str(recipe.prompts(split)),
        "--output", str(recipe.dataset(split)),
        "--max-new-tokens", str(settings.max_new_tokens),
        "--device", recipe.device, "--dtype", settings.regen_dtype,
    ]  # fmt: skip
    checked(run_step(f"data_{split}", recipe, command), f"regenerating the {split} data")
    stamp_file.write_text(json.dumps(stamp) + "\n")


def train(recipe: Recipe, objective: str, run_dir: Path) -> None:
    """Step 3 for one objective, in a fresh run directory."""
    shutil.rmtree(run_dir, ignore_errors=True)
    layout = recipe.config.layout
    sets = [
        f"run.run_dir={json.dumps(str(run_dir))}",
        f"drafter.objective={json.dumps(objective)}",
        *recipe.overrides,
    ]
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        "--nproc-per-node", str(layout.targets_per_node + layout.drafters_per_node),
        "-m", "ringtrain.main", "--config", str(ROOT / recipe.settings.config),
        *[arg for assignment in sets for arg in ("--set", assignment)],
    ]  # fmt: skip
    checked(run_step(f"train_{objective}", recipe, command), f"training ({objective})")


def held_out(run_dir: Path) -> dict:
    """The last held-out evaluation record of a run (tau_sim), or {} without one."""
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if r.get("event") == "eval"]
    return evals[-1] if evals else {}


def evaluate(recipe: Recipe, objective: str, run_dir: Path, dtype: str) -> dict:
    """Step 4 for one objective and dtype: ringtrain-eval's JSON (its exit status beside)."""
    command = [
        sys.executable, "-m", "ringtrain.cli.eval",
        "--target", str(recipe.target), "--drafter", str(run_dir),
        "--prompts", str(recipe.prompts("eval")),
        "--max-new-tokens", str(recipe.settings.max_new_tokens),
        "--device", recipe.device, "--dtype", dtype, "--json",
    ]  # fmt: skip
    proc = run_step(f"eval_{objective}_{dtype}", recipe, command)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode not in (0, 1) or not lines:
        return {"error": f"ringtrain-eval exit {proc.returncode}"}
    return {**json.loads(lines[-1]), "exit": proc.returncode}


def run_recipe(recipe: Recipe, objectives: list[str]) -> dict:
    """Every step; returns the results (timings included), saved after every step."""
    started = time.perf_counter()
    report = {
        "device": recipe.device,
        "machine": machine_name(recipe.device),
        "date": date.today().isoformat(),
        "settings": msgspec.to_builtins(recipe.settings),
        "overrides": recipe.overrides,
        "timings_s": {},
        "objectives": {},
    }

    def save() -> None:
        report["timings_s"] = {k: round(v, 1) for k, v in recipe.timings.items()}
        report["timings_s"]["total"] = round(time.perf_counter() - started, 1)
        save_report(recipe, report)

    make_target(recipe)
    for split in ("train", "eval"):
        make_data(recipe, split)
        save()
    for objective in objectives:
        run_dir = recipe.run_dir(objective, len(objectives) > 1)
        train(recipe, objective, run_dir)
        entry = {"run_dir": str(run_dir), "held_out": held_out(run_dir), "eval": {}}
        report["objectives"][objective] = entry
        for dtype in recipe.settings.eval_dtypes:
            entry["eval"][dtype] = evaluate(recipe, objective, run_dir, dtype)
            save()
    return report


def save_report(recipe: Recipe, report: dict) -> None:
    """Write the results so far to $OUT/toy_recipe.json (when set) and the run directory."""
    text = json.dumps(report, indent=2) + "\n"
    for directory in (os.environ.get("OUT"), ROOT / recipe.config.run.run_dir):
        if directory:
            Path(directory).mkdir(parents=True, exist_ok=True)
            (Path(directory) / "toy_recipe.json").write_text(text)


def machine_name(device: str) -> str:
    """The GPU's name, or "CPU"."""
    if device != "cuda":
        return "CPU"
    import torch

    return torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CUDA (not visible)"


def _eval_cell(result: dict) -> str:
    if "error" in result:
        return result["error"]
    mismatches = len(result["mismatches"])
    return f"{result['tau_real']:.3f} ({result['numerical_ties']} ties, {mismatches} mismatches)"


def _headline(report: dict, objective: str) -> tuple[str, dict, float | None]:
    """(dtype, eval result, tau_sim) of one objective: the first evaluated dtype."""
    entry = report["objectives"][objective]
    dtype, result = next(iter(entry["eval"].items()))
    return dtype, result, entry["held_out"].get("tau_sim")


def goal_lines(report: dict) -> list[str]:
    """The verdict of each objective against the recipe's goals (GPU goals on any device)."""
    lines = []
    for objective in report["objectives"]:
        dtype, result, tau_sim = _headline(report, objective)
        if "error" in result:
            lines.append(f"{objective}: evaluation failed: {result['error']}")
            continue
        tau = result["tau_real"]
        ok = tau >= GOALS["tau_real"] and not result["mismatches"]
        gap = (tau_sim - tau) / tau if tau_sim is not None and tau else None
        gap_text = "no held-out evaluation" if gap is None else f"{gap:+.1%}"
        gap_ok = gap is not None and abs(gap) <= GOALS["tau_sim_gap"]
        lines.append(
            f"{objective}: tau_real ({dtype}) >= {GOALS['tau_real']} with 0 mismatches: "
            f"{'yes' if ok else 'NO'} ({tau:.3f}, {len(result['mismatches'])} mismatches); "
            f"tau_sim within {GOALS['tau_sim_gap']:.0%}: {'yes' if gap_ok else 'NO'} ({gap_text})"
        )
    total = report["timings_s"]["total"]
    lines.append(
        f"recipe <= {GOALS['seconds']:.0f} s: "
        f"{'yes' if total <= GOALS['seconds'] else 'NO'} ({total:.0f} s)"
    )
    return lines


def benchmark_lines(report: dict, command: str) -> list[str]:
    """BENCHMARKS.md lines (`- metric: value (machine, date, command)`) for the recipe's goals."""
    where = f"{report['machine']}, {report['date']}, `{command}`"
    suffix = "_gpu" if report["device"] == "cuda" else ""
    objectives = list(report["objectives"])
    dtype, result, tau_sim = _headline(report, objectives[0])
    if "error" in result:
        return []
    others = "".join(
        f"; {d} {r['tau_real']:.3f}, {'lossless' if r['lossless'] else 'NOT lossless'}"
        for d, r in report["objectives"][objectives[0]]["eval"].items()
        if d != dtype and "error" not in r
    )
    steps = ", ".join(f"{k} {v:.0f}" for k, v in report["timings_s"].items() if k != "total")
    lines = [
        f"- tau_real{suffix}: {result['tau_real']:.3f} ({where}; {dtype}, {result['prompts']} "
        f"held-out prompts, {len(result['mismatches'])} mismatches{others})",
        f"- numerical_ties{suffix}: {result['numerical_ties']} ({where}; {result['tie_rule']})",
        f"- recipe{suffix}_s: {report['timings_s']['total']:.0f} "
        f"({where}; seconds per step: {steps})",
    ]
    if tau_sim is not None:
        lines.insert(1, f"- tau_sim{suffix}: {tau_sim:.3f} ({where}; held-out, last step)")
    if len(objectives) > 1:
        for objective in objectives:
            _, other, _ = _headline(report, objective)
            if "error" not in other:
                value = other["tau_real"]
                lines.append(f"- tau_real{suffix}_{objective}: {value:.3f} ({where}; {dtype})")
    return lines


def table(report: dict, command: str) -> str:
    """The closing summary: timings, results per objective, goals, BENCHMARKS lines."""
    lines = [f"toy recipe on {report['machine']} ({report['device']}), {report['date']}", ""]
    lines += [f"{'step':<32}{'seconds':>10}"]
    lines += [f"{name:<32}{seconds:>10.1f}" for name, seconds in report["timings_s"].items()]
    lines.append("")
    for objective, entry in report["objectives"].items():
        held_out = entry["held_out"]
        tau_sim, uniform = held_out.get("tau_sim"), held_out.get("tau_uniform")
        lines.append(
            f"{objective}: tau_sim {'-' if tau_sim is None else f'{tau_sim:.3f}'} (held-out "
            f"replay of decoding; tau_uniform {'-' if uniform is None else f'{uniform:.3f}'}, "
            "the uniform-anchor figure, is not acceptance)"
        )
        for dtype, result in entry["eval"].items():
            lines.append(f"  tau_real {dtype:<9} {_eval_cell(result)}")
    lines += ["", "goals:", *goal_lines(report), "", "BENCHMARKS.md lines:"]
    lines += benchmark_lines(report, command) or ["(none: the evaluation failed)"]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--device", choices=["cpu", "cuda"], help="run the recipe on this device")
    what.add_argument(
        "--report",
        metavar="JSON",
        help="print the closing report of a finished run again (its toy_recipe.json)",
    )
    parser.add_argument(
        "--objectives",
        default="",
        help="comma-separated drafter objectives to train and compare on the same data and "
        "steps (decayed_ce, dpace; default: the training config's)",
    )
    parser.add_argument("--fresh", action="store_true", help="remake the target and the data")
    add_override_option(parser)
    parser.add_argument("--recipes", default=str(RECIPES), help="recipe settings file")
    return parser.parse_args(argv)


def load_recipe(args: argparse.Namespace) -> Recipe:
    """The recipe of the device from the settings file, with its training config."""
    tables = msgspec.toml.decode(Path(args.recipes).read_bytes())
    if args.device not in tables:
        raise SystemExit(f"toy_recipe: {args.recipes} has no [{args.device}] section")
    settings = msgspec.convert(tables[args.device], RecipeSettings)
    config = load_config(ROOT / settings.config, args.overrides)
    return Recipe(args.device, settings, config, args.overrides, args.fresh)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.report:
        report = json.loads(Path(args.report).read_text())
        print(table(report, report.get("command", "launch/toy_recipe.sh")), flush=True)
        return 0
    recipe = load_recipe(args)
    objectives = [o for o in args.objectives.split(",") if o] or [recipe.config.drafter.objective]
    report = run_recipe(recipe, objectives)
    command = "launch/toy_recipe.sh " + " ".join(sys.argv[1:] if argv is None else argv)
    report["command"] = command.strip()
    save_report(recipe, report)
    print(table(report, command.strip()), flush=True)
    lossless = all(
        r.get("exit") == 0
        for entry in report["objectives"].values()
        for r in entry["eval"].values()
    )
    return 0 if lossless else 1


if __name__ == "__main__":
    sys.exit(main())
