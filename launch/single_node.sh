#!/usr/bin/env bash
# Train on one node: all GPUs of this machine, roles from the config's [layout].
# Usage: launch/single_node.sh CONFIG [--mps] [--resume] [--set section.key=value ...]
# Runs with the project's environment (launch/python.sh): no venv needs activating.
# --mps runs the CUDA MPS daemon for the run (for layouts whose gpu_map puts a target and
# a drafter on one GPU: their kernels then share the GPU instead of being time-sliced);
# it is stopped again when the run ends.
set -euo pipefail
if [ $# -lt 1 ]; then
    echo "usage: $0 CONFIG [--mps] [--resume] [--set section.key=value ...]" >&2
    exit 2
fi
config=$1
shift
source "$(dirname "${BASH_SOURCE[0]}")/python.sh"
args=()
mps=0
for arg in "$@"; do
    if [ "$arg" = --mps ]; then mps=1; else args+=("$arg"); fi
done
nproc=$("$python" -c 'import sys
from ringtrain.config import load_config
layout = load_config(sys.argv[1]).layout
print(layout.targets_per_node + layout.drafters_per_node)' "$config")
if [ $mps = 1 ]; then
    if ! command -v nvidia-cuda-mps-control > /dev/null; then
        echo "--mps: nvidia-cuda-mps-control is not installed (it comes with the NVIDIA driver)" >&2
        exit 2
    fi
    nvidia-cuda-mps-control -d
    trap 'echo quit | nvidia-cuda-mps-control' EXIT
fi
"$python" -m ringtrain.launch --standalone --nproc-per-node "$nproc" --config "$config" ${args[@]+"${args[@]}"}
