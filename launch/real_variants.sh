#!/usr/bin/env bash
# The real-model recipe's training variants side by side: real_recipe's model and data
# (SmolLM2-135M-Instruct answering code prompts), then each variant of
# configs/recipes/smollm2.toml's [variants.<device>] section (decayed_ce, dpace, dflash2,
# muon, wsd, best) trained one after another with the same steps, and each evaluated
# (tau_sim from the held-out replay, tau_real from ringtrain-eval on HumanEval)
# (tools/recipes/real_variants.py).
# Usage: launch/real_variants.sh --device cpu|cuda [--gguf FILE] [--fresh]
#        [--only NAME ...] [--steps N] [--set section.key=value ...]
# Runs with the project's environment (launch/python.sh).
# Results: a table printed last, JSON in $OUT/real_variants.json (when $OUT is set) and in
# the variants' directory (<run_dir>-variants), written after every variant.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/python.sh"
cd "$root"
exec "$python" -m tools.recipes.real_variants "$@"
