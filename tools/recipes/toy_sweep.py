"""Choose the toy recipe's drafter settings by measurement: several variants, one target.

    python -m tools.recipes.toy_sweep --device cuda \\
        --variant 'base=drafter.num_layers=2' \\
        --variant 'deep=drafter.num_layers=2;target.tap_layers=[1,3,4]'

The recipe's target and data are made (or reused) exactly as ``tools/recipes/toy_recipe.py``
makes them; each variant then trains a drafter with the recipe's training config plus
its own ``--set`` assignments (``;``-separated) in a run directory of its own, and its
held-out evaluation at the last step gives tau_sim (the replay of speculative decoding,
which tracks ringtrain-eval's tau_real). A variant that would start after
``--time-limit`` seconds is skipped, so a bounded machine still returns every finished
result. Results: a table printed last, JSON in $OUT/toy_sweep.json (when $OUT is set).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from ringtrain.cli.train_args import add_override_option
from tools.recipes.toy_recipe import (
    RECIPES,
    Recipe,
    held_out,
    load_recipe,
    log,
    make_data,
    make_target,
    train,
)


def parse_variant(text: str) -> tuple[str, list[str]]:
    """``name=key=value;key=value`` -> (name, ["key=value", ...])."""
    name, sep, assignments = text.partition("=")
    if not sep or not name:
        raise SystemExit(f"toy_sweep: --variant {text!r} is not NAME=key=value[;key=value]")
    return name, [part.strip() for part in assignments.split(";") if part.strip()]


def run_variant(recipe: Recipe, name: str, sets: list[str]) -> dict:
    """Train one variant in its own run directory; its last held-out record and timing."""
    base = Path(recipe.config.run.run_dir)
    run_dir = base.with_name(f"{base.name}-{name}")
    variant = Recipe(
        recipe.device, recipe.settings, recipe.config, [*recipe.overrides, *sets], False
    )
    started = time.perf_counter()
    train(variant, recipe.config.drafter.objective, run_dir)
    record = held_out(run_dir)
    return {
        "sets": sets,
        "seconds": round(time.perf_counter() - started, 1),
        "tau_sim": record.get("tau_sim"),
        "accuracy": record.get("accuracy"),
        "accuracy_per_slot": record.get("accuracy_per_slot", [])[:4],
        "loss": record.get("loss"),
        "step": record.get("step"),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", required=True, choices=["cpu", "cuda"])
    parser.add_argument("--variant", action="append", default=[], required=True)
    parser.add_argument("--time-limit", type=float, default=float("inf"), help="seconds")
    parser.add_argument("--recipes", default=str(RECIPES), help="recipe settings file")
    add_override_option(parser)
    args = parser.parse_args(argv)
    args.fresh = False
    if any(assignment.startswith("run.run_dir") for assignment in args.overrides):
        raise SystemExit(
            "toy_sweep: each variant trains in a run directory of its own; drop --set run.run_dir"
        )
    recipe = load_recipe(args)
    started = time.perf_counter()
    make_target(recipe)
    for split in ("train", "eval"):
        make_data(recipe, split)
    results: dict[str, dict] = {}
    out = os.environ.get("OUT")
    for name, sets in map(parse_variant, args.variant):
        elapsed = time.perf_counter() - started
        if results and elapsed + max(r["seconds"] for r in results.values()) > args.time_limit:
            log(f"variant {name}: skipped ({elapsed:.0f} s used of {args.time_limit:.0f})")
            continue
        results[name] = run_variant(recipe, name, sets)
        if out:
            Path(out, "toy_sweep.json").write_text(json.dumps(results, indent=2) + "\n")
    print(f"{'variant':<14}{'tau_sim':>9}{'acc':>7}{'seconds':>9}  settings")
    for name, r in results.items():
        tau = "-" if r["tau_sim"] is None else f"{r['tau_sim']:.3f}"
        acc = "-" if r["accuracy"] is None else f"{r['accuracy']:.3f}"
        print(f"{name:<14}{tau:>9}{acc:>7}{r['seconds']:>9.0f}  {'; '.join(r['sets'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
