#!/usr/bin/env bash
# Set up the environment if needed, check the house style, and run the test suite.
# Extra arguments go to pytest (e.g. `tools/test.sh -k ring`).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=$("$root/tools/setup_env.sh")
cd "$root"
"$venv/bin/ruff" check .
"$venv/bin/ruff" format --check .
exec "$venv/bin/python" -m pytest "$@"
