#!/usr/bin/env bash
# The toy recipe in one command: a small target trained on local text, data regenerated
# with it, a drafter trained on that data, and ringtrain-eval on held-out prompts, each
# step timed (tools/recipes/toy_recipe.py; sizes in configs/recipes/toy.toml).
# Usage: launch/toy_recipe.sh --device cpu|cuda [--objectives decayed_ce,dpace] [--fresh]
#        [--set section.key=value ...]
# Runs with the project's environment (launch/python.sh).
# Timings and results: a table printed last, JSON in $OUT/toy_recipe.json (when $OUT is
# set) and in the run directory.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/python.sh"
cd "$root"
exec "$python" -m tools.recipes.toy_recipe "$@"
