#!/usr/bin/env bash
# Set up the environment if needed (with the test tools), check the house style, and run
# the test suite. Extra arguments go to pytest (e.g. `tools/test.sh -k ring`).
# The full suite takes about 18-21 minutes on an idle 2-core machine, up to 23 on a slower
# one (BENCHMARKS.md, ci_suite_s), several times that while other work shares the cores;
# a test that runs long is named on the terminal while it runs (tests/conftest.py).
# `--quick` (first argument) leaves out the tests marked slow (the multi-process
# end-to-end runs): the day-to-day tier. `--scripts` runs only the smoke runs of the
# benchmark and recipe scripts that take minutes (marked scripts, left out by default).
set -euo pipefail
quick=()
tier="the full suite: about 18-21 minutes on an idle 2-core machine; --quick is the fast tier"
if [ "${1:-}" = --quick ]; then
    quick=(-m "not slow and not scripts")
    tier="the quick tier: the suite without the slow multi-process runs (CI runs them all)"
    shift
elif [ "${1:-}" = --scripts ]; then
    quick=(-m scripts)
    tier="the scripts' smoke runs: several minutes each on a 2-core machine"
    shift
fi
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=$("$root/tools/setup_env.sh" --test)
cd "$root"
# Compiled bytecode is kept in the venv, also where PYTHONDONTWRITEBYTECODE is set: without
# it every process the multi-process tests start (hundreds in a run) compiled torch's and
# transformers' sources again, 10-30 s each on a busy 2-core machine.
export PYTHONPYCACHEPREFIX="$venv/pycache"
unset PYTHONDONTWRITEBYTECODE
"$venv/bin/ruff" check .
"$venv/bin/ruff" format --check .
echo "ringtrain: running $tier" >&2
exec "$venv/bin/python" -m pytest ${quick[@]+"${quick[@]}"} "$@"
