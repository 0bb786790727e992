"""The real-model recipe's training variants side by side, on the same data and steps.

    launch/real_variants.sh --device cuda   # or --device cpu (tiny sizes, a smoke run)

The model, the prompts and the data are real_recipe's (its own steps, reused when a
previous run made them with the same settings). Then each variant of the device's
``[variants.<device>]`` section of configs/recipes/smollm2.toml (a name and a list of
training-config overrides ``section.key=value``) trains one after another on the
largest training set with the same number of steps, each into its own run directory
(``<run_dir>-variants/<name>``), and is evaluated: tau_sim from the held-out replay at
its last step (metrics.jsonl), tau_real from ringtrain-eval on HumanEval in the recipe's
first eval dtype (the first ``eval_limit`` problems; 0: all), with its lossless check.

``--parallel N`` (or ``parallel`` in the settings) trains N variants at once on the one
GPU, under the CUDA MPS daemon on CUDA, then evaluates them one after another: a drafter
of a 135M target leaves most of an H200 idle, so the variants take about the time of
one. Their training tokens/s are then shares of the GPU, comparable among variants
trained together only; the report says which trained together.

The results go to $OUT/real_variants.json (when $OUT is set) and to the variants'
directory after each group's training and each variant's evaluation, so a stopped run
keeps what it finished (every trained variant's tau_sim); a table with the BENCHMARKS.md
lines is printed last. The same command run again reuses every variant that it trained
to the end (``variant-trained.json`` beside the run: the same command on the same data)
and those variants' evaluations, so
a comparison longer than one device call runs as several (``--fresh`` starts over).
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import time
from datetime import date
from pathlib import Path
from typing import Annotated

import msgspec

from ringtrain.config import Config, ConfigError, load_config
from tools.recipes.children import stop_children_on_sigterm
from tools.recipes.mps import mps_daemon
from tools.recipes.real_base import ROOT, RealRecipe, Timed
from tools.recipes.real_eval import benchmark_metric, benchmark_rows, evaluate_drafter
from tools.recipes.real_recipe import (
    held_out,
    load_recipe,
    log,
    make_data_steps,
    recipe_parser,
    recipe_tables,
    run_children,
    source_rows,
    steps_mps,
    train_command,
    train_rate,
    trains_under_mps,
)
from tools.recipes.real_report import machine_name, save_json, summary

VARIANT_NAME = re.compile(r"[a-z0-9_]+")


class VariantsSettings(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """One device's [variants.<device>] section of configs/recipes/smollm2.toml."""

    # Training steps of every variant (its one held-out evaluation and checkpoint at the end).
    steps: Annotated[int, msgspec.Meta(ge=1)]
    # ringtrain-eval's prompts of each benchmark per variant (0: all).
    eval_limit: Annotated[int, msgspec.Meta(ge=0)] = 0
    # Temperatures each variant is evaluated at (one ringtrain-eval run): 0 greedy, with
    # its lossless check; above 0 the speculative sampling rule.
    temperatures: list[Annotated[float, msgspec.Meta(ge=0)]] = msgspec.field(
        default_factory=lambda: [0.0]
    )
    # Variants trained at once on the one device (under the CUDA MPS daemon on CUDA).
    parallel: Annotated[int, msgspec.Meta(ge=1)] = 1
    # name -> training-config overrides (section.key=value), after the recipe's own.
    variants: dict[str, list[str]]
    # name -> the sources of the recipe's training prompts (real_prompts: "code",
    # "synthesized", "synthesized_two_turn") whose rows the variant trains on; a variant
    # not named here trains on every row. A data-mixture comparison at equal steps.
    train_sources: dict[str, list[str]] = {}


# Beside a variant's run: the command that trained it to the end and what it measured.
TRAINED = "variant-trained.json"


def load_settings(tables: dict, device: str, source: str) -> VariantsSettings:
    """The device's variants section, every name checked."""
    section = tables.get("variants", {}).get(device)
    if section is None:
        raise SystemExit(f"real_variants: {source} has no [variants.{device}] section")
    try:
        settings = msgspec.convert(section, VariantsSettings)
    except msgspec.ValidationError as exc:
        raise SystemExit(f"real_variants: {source} [variants.{device}]: {exc}") from None
    unknown = sorted(set(settings.train_sources) - set(settings.variants))
    if unknown:
        raise SystemExit(
            f"real_variants: {source} [variants.{device}] train_sources names "
            f"{', '.join(unknown)}, which are not variants"
        )
    for name in settings.variants:
        if not VARIANT_NAME.fullmatch(name):
            raise SystemExit(
                f"real_variants: variant name {name!r} in {source}: use lower-case letters, "
                "digits and underscores (it names a run directory and a BENCHMARKS.md line)"
            )
    return settings


def variant_overrides(recipe: RealRecipe, steps: int, sets: list[str]) -> list[str]:
    """The recipe's overrides, the common steps (one evaluation and checkpoint, at the
    end), then the variant's own."""
    every = [f"run.{key}={steps}" for key in ("max_steps", "eval_every", "checkpoint_every")]
    return [*recipe.overrides, *every, *sets]


def variant_configs(
    recipe: RealRecipe, settings: VariantsSettings, chosen: list[str]
) -> dict[str, tuple[list[str], Config]]:
    """Each chosen variant's overrides and the config they make, all checked before any
    training starts (a typo fails here, naming the variant)."""
    unknown = sorted(set(chosen) - set(settings.variants))
    if unknown:
        raise SystemExit(
            f"real_variants: no variant {', '.join(unknown)}; the settings list "
            f"{', '.join(settings.variants)}"
        )
    configs = {}
    for name in chosen:
        overrides = variant_overrides(recipe, settings.steps, settings.variants[name])
        try:
            configs[name] = (overrides, load_config(ROOT / recipe.settings.config, overrides))
        except ConfigError as exc:
            raise SystemExit(f"real_variants: variant {name!r}: {exc}") from None
    return configs


def variants_dir(recipe: RealRecipe) -> Path:
    """Where the variants' run directories go: beside the recipe's run directory."""
    base = ROOT / recipe.config.run.run_dir
    return base.with_name(f"{base.name}-variants")


def variant_train_set(recipe: RealRecipe, settings: VariantsSettings, name: str) -> Path:
    """The variant's training set: the recipe's largest, or (train_sources) the rows of
    the sources named for it, cut from that set beside it."""
    train_set = recipe.train_set(recipe.largest)
    names = settings.train_sources.get(name)
    if not names:
        return train_set
    subset = train_set.with_name(f"{train_set.name}-{name}")
    rows = source_rows(train_set, subset, names)
    log(f"{name}: {rows} rows of {', '.join(names)} in {subset}")
    return subset


def training_key(recipe: RealRecipe, command: list[str]) -> dict:
    """What decides a variant's training: its command, and the regeneration that made the
    training data (the same paths hold other data once the data step ran with other
    settings, e.g. another sampled_fraction)."""
    data = recipe.dataset("train") / "recipe.json"
    made_by = json.loads(data.read_text()) if data.is_file() else None
    return {"command": command[1:], "data": made_by}


def trained_before(run_dir: Path, key: dict) -> dict | None:
    """The training facts that an earlier run recorded in ``run_dir`` when it trained the
    variant to the end as ``key`` says (training_key); None when it did not."""
    stamp = run_dir / TRAINED
    if not stamp.is_file():
        return None
    facts = json.loads(stamp.read_text())
    recorded = {name: facts.pop(name, None) for name in key}
    return facts if recorded == key else None


def train_group(
    recipe: RealRecipe, settings: VariantsSettings, group: dict[str, tuple[list[str], Config]]
) -> dict[str, dict]:
    """Train the ``group``'s variants at once (under MPS on CUDA when more than one), each
    in a fresh run directory (see the module); each one's training facts, or its error. A
    variant that an earlier run trained to the end with the same command is reused (its
    facts as that run recorded them, ``reused`` set), so the variants can run as several
    device calls."""
    run_dirs = {name: variants_dir(recipe) / name for name in group}
    commands, entries, keys = {}, {}, {}
    for name, (overrides, config) in group.items():
        train_set = variant_train_set(recipe, settings, name)
        command = train_command(recipe, run_dirs[name], train_set, overrides, config)
        keys[name] = training_key(recipe, command)
        earlier = None if recipe.fresh else trained_before(run_dirs[name], keys[name])
        if earlier is not None:
            log(f"{name}: reusing the training in {run_dirs[name]}")
            entries[name] = {**earlier, "reused": True}
            continue
        shutil.rmtree(run_dirs[name], ignore_errors=True)
        commands[name] = command
    if not commands:
        return entries
    label = f"train_{'+'.join(commands)}"
    with (
        mps_daemon(trains_under_mps(recipe, len(commands) > 1)),
        Timed(recipe, label, recorded=False),
    ):
        procs = run_children({f"train_{name}": command for name, command in commands.items()})
    for name in commands:
        run_dir, proc = run_dirs[name], procs[f"train_{name}"]
        entry = {"run_dir": str(run_dir), "train_s": round(recipe.timings[label], 1)}
        if len(commands) > 1:
            entry["trained_with"] = [other for other in commands if other != name]
        if proc.returncode != 0:
            log(f"train_{name} failed (exit {proc.returncode}); the other variants go on")
            sys.stderr.write(proc.stdout[-4000:])
            entry["error"] = f"training exit {proc.returncode}"
        else:
            entry.update(held_out=held_out(run_dir), train_tokens_per_s=train_rate(run_dir))
            (run_dir / TRAINED).write_text(json.dumps({**keys[name], **entry}) + "\n")
        entries[name] = entry
    return {name: entries[name] for name in group}


def evaluate_variant(
    recipe: RealRecipe, settings: VariantsSettings, name: str, entry: dict
) -> dict:
    """ringtrain-eval of one trained variant in the recipe's first eval dtype, greedy
    (``eval``) and at the settings' other temperatures (``sampled``, by evaluation key),
    timed (a reused training's evaluation by the same command is reused too)."""
    dtype = recipe.settings.eval_dtypes[0]
    drafter, reuse = Path(entry["run_dir"]), entry.get("reused", False)
    temperatures = [0.0, *(t for t in settings.temperatures if t > 0)]
    with Timed(recipe, f"eval_{name}", recorded=False):
        results = evaluate_drafter(recipe, drafter, dtype, settings.eval_limit, temperatures, reuse)
    greedy = results.pop(dtype)
    seconds = round(recipe.timings[f"eval_{name}"], 1)
    return {"eval": greedy, "sampled": results, "eval_dtype": dtype, "eval_s": seconds}


def run_variants(recipe: RealRecipe, settings: VariantsSettings, chosen: list[str]) -> dict:
    """Data (real_recipe's steps), then the chosen variants ``settings.parallel`` at a
    time: trained together, evaluated one after another; the report is saved after each
    variant's evaluation."""
    configs = variant_configs(recipe, settings, chosen)
    started = time.perf_counter()
    report = {
        "device": recipe.device,
        "machine": machine_name(recipe.device),
        "date": date.today().isoformat(),
        "settings": msgspec.to_builtins(settings),
        "recipe_settings": msgspec.to_builtins(recipe.settings),
        "overrides": recipe.overrides,
        "regenerate": make_data_steps(recipe),
        "variants": {},
    }
    with steps_mps(recipe, shared=settings.parallel > 1):
        run_groups(recipe, settings, configs, report, started)
    return report


def run_groups(
    recipe: RealRecipe,
    settings: VariantsSettings,
    configs: dict[str, tuple[list[str], Config]],
    report: dict,
    started: float,
) -> None:
    """Train and evaluate the variants ``settings.parallel`` at a time, into ``report``
    (saved after each group's training and after each evaluation, so a run cut short
    keeps every trained variant's tau_sim; its total time counted from ``started``)."""

    def save() -> None:
        report["timings_s"] = {k: round(v, 1) for k, v in recipe.timings.items()}
        report["timings_s"]["total"] = round(time.perf_counter() - started, 1)
        save_json(report, "real_variants.json", variants_dir(recipe))

    names = list(configs)
    for first in range(0, len(names), settings.parallel):
        group = {name: configs[name] for name in names[first : first + settings.parallel]}
        trained = train_group(recipe, settings, group)
        for name, entry in trained.items():
            sources = settings.train_sources.get(name)
            data = {"train_sources": sources} if sources else {}
            report["variants"][name] = {"overrides": settings.variants[name], **data, **entry}
        save()
        for name, entry in trained.items():
            if "error" not in entry:
                report["variants"][name].update(evaluate_variant(recipe, settings, name, entry))
                save()


def cell(value: float | None, spec: str) -> str:
    """A table cell: the value formatted, or "-" without one."""
    return "-" if value is None else format(value, spec)


def variant_rows(report: dict) -> list[str]:
    """The table: one row per variant."""
    rows = [
        f"{'variant':<14} {'tau_sim':>8} {'tau_real':>9} {'ties/mism':>10} "
        f"{'train tok/s':>12} {'train s':>8} {'eval s':>7}"
    ]
    for name, entry in report["variants"].items():
        result = entry.get("eval", {})
        ties = (
            f"{result['numerical_ties']}/{len(result['mismatches'])}"
            if "tau_real" in result
            else "-"
        )
        rows.append(
            f"{name:<14} {cell(entry.get('held_out', {}).get('tau_sim'), '.3f'):>8} "
            f"{cell(result.get('tau_real'), '.3f'):>9} {ties:>10} "
            f"{cell(entry.get('train_tokens_per_s'), ',.0f'):>12} "
            f"{cell(entry.get('train_s'), '.0f'):>8} {cell(entry.get('eval_s'), '.0f'):>7}"
        )
    per_benchmark = {}
    for name, entry in report["variants"].items():
        per_benchmark[name] = entry.get("eval", {})
        for key, result in entry.get("sampled", {}).items():
            per_benchmark[f"{name} {key.removeprefix(entry['eval_dtype'] + '-')}"] = result
    return [*rows, "", *benchmark_rows(per_benchmark)]


def benchmark_lines(report: dict, command: str) -> list[str]:
    """BENCHMARKS.md lines, one per variant and benchmark
    (`- tau_real_<benchmark>_<variant>: value (machine, date, command; ...)`)."""
    where = f"{report['machine']}, {report['date']}, `{command}`"
    steps = report["settings"]["steps"]
    lines = []
    for name, entry in report["variants"].items():
        result = entry.get("eval", {})
        if "tau_real" not in result:
            continue
        tau_sim = entry["held_out"].get("tau_sim")
        together = entry.get("trained_with")
        shared = f"; trained at once with {', '.join(together)}" if together else ""
        data = (
            f"; trained on {', '.join(entry['train_sources'])}" if "train_sources" in entry else ""
        )
        evaluations = [("", result)] + [
            (f"_t{evaluation['temperature']:g}", evaluation)
            for evaluation in entry.get("sampled", {}).values()
            if "tau_real" in evaluation
        ]
        for suffix, evaluation in evaluations:
            for benchmark, figures in evaluation.get("benchmarks", {}).items():
                lines.append(
                    f"- {benchmark_metric(benchmark)}{suffix}_{name}: "
                    f"{figures['tau_real']:.3f} ({where}; "
                    f"{' '.join(entry['overrides']) or 'the defaults'}{data}; {steps} steps"
                    f"{shared}; {entry['eval_dtype']}, {figures['prompts']} turns, "
                    f"{figures.get('numerical_ties', 0)} ties, {len(result['mismatches'])} "
                    f"mismatches in the greedy evaluation; tau_sim {cell(tau_sim, '.3f')}; "
                    f"training {cell(entry.get('train_tokens_per_s'), ',.0f')} tokens/s)"
                )
    return lines


def table(report: dict, command: str) -> str:
    """The closing summary: timings, the variants' table, BENCHMARKS lines."""
    return summary(
        report, "real-model variants", variant_rows(report), benchmark_lines(report, command)
    )


def main(argv: list[str] | None = None) -> int:
    parser = recipe_parser(__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", default=[], help="run these variants only")
    parser.add_argument("--steps", type=int, help="steps per variant (default: the settings')")
    parser.add_argument(
        "--parallel", type=int, help="variants trained at once (default: the settings')"
    )
    parser.add_argument(
        "--temperature",
        type=float,
        action="append",
        dest="temperatures",
        help="evaluate each variant at this temperature too (repeatable; 0 always; "
        "default: the settings')",
    )
    parser.add_argument(
        "--eval-limit",
        type=int,
        help="prompts of each benchmark evaluated per variant, the first N (0: all; "
        "default: the settings')",
    )
    args = parser.parse_args(argv)
    if any(t < 0 for t in args.temperatures or []):
        parser.error("--temperature: give 0 (greedy) or more")
    stop_children_on_sigterm()
    lowest = {"steps": 1, "parallel": 1, "eval_limit": 0}
    for flag, least in lowest.items():
        value = getattr(args, flag)
        if value is not None and value < least:
            parser.error(f"--{flag.replace('_', '-')} {value}: give {least} or more")
    recipe = load_recipe(args)
    settings = load_settings(recipe_tables(args), args.device, args.recipes)
    chosen = {flag: getattr(args, flag) for flag in (*lowest, "temperatures")}
    settings = msgspec.structs.replace(
        settings, **{flag: value for flag, value in chosen.items() if value is not None}
    )
    report = run_variants(recipe, settings, args.only or list(settings.variants))
    command = "launch/real_variants.sh " + " ".join(sys.argv[1:] if argv is None else argv)
    print(table(report, command.strip()), flush=True)
    evals = [entry.get("eval", {}) for entry in report["variants"].values()]
    return 0 if all(result.get("exit") == 0 for result in evals) else 1


if __name__ == "__main__":
    sys.exit(main())
