#!/usr/bin/env bash
# Set up the environment if needed and train a drafter on the embedded default:
# a tiny built-in hybrid target and a synthetic dataset, 2 target ranks + 1 drafter
# rank, on CPU or GPU. Extra arguments go to ringtrain.main (e.g. --config FILE).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=$("$root/tools/setup_env.sh")
cd "$root"
exec "$venv/bin/torchrun" --standalone --nproc-per-node 3 -m ringtrain.main "$@"
