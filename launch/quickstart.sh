#!/usr/bin/env bash
# Set up the environment if needed and train a drafter on the embedded default:
# a tiny built-in hybrid target and a synthetic dataset, 1 target rank + 2 drafter
# ranks, on CPU or GPU. Extra arguments go to ringtrain.main (e.g. --config FILE).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=$("$root/tools/setup_env.sh")
cd "$root"
exec "$venv/bin/python" -m ringtrain.launch --standalone --nproc-per-node 3 "$@"
