#!/usr/bin/env bash
# Set up the environment if needed, check the house style, and run the test suite.
# Extra arguments go to pytest (e.g. `tools/test.sh -k ring`). `--quick` (first argument)
# leaves out the tests marked slow (the multi-process end-to-end runs): the day-to-day tier.
# `--scripts` runs only the smoke runs of the benchmark and recipe scripts that take
# minutes (marked scripts, left out of the suite by default).
set -euo pipefail
quick=()
if [ "${1:-}" = --quick ]; then
    quick=(-m "not slow and not scripts")
    shift
elif [ "${1:-}" = --scripts ]; then
    quick=(-m scripts)
    shift
fi
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=$("$root/tools/setup_env.sh")
cd "$root"
# Compiled bytecode is kept in the venv, also where PYTHONDONTWRITEBYTECODE is set: without
# it every process the multi-process tests start (hundreds in a run) compiled torch's and
# transformers' sources again, 10-30 s each on a busy 2-core machine.
export PYTHONPYCACHEPREFIX="$venv/pycache"
unset PYTHONDONTWRITEBYTECODE
"$venv/bin/ruff" check .
"$venv/bin/ruff" format --check .
exec "$venv/bin/python" -m pytest ${quick[@]+"${quick[@]}"} "$@"
