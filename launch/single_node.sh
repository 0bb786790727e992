#!/usr/bin/env bash
# Train on one node: all GPUs of this machine, roles from the config's [layout].
# Usage: launch/single_node.sh CONFIG [--resume] [--set section.key=value ...]
set -euo pipefail
if [ $# -lt 1 ]; then
    echo "usage: $0 CONFIG [--resume] [--set section.key=value ...]" >&2
    exit 2
fi
config=$1
shift
nproc=$(python3 -c 'import sys
from ringtrain.config import load_config
layout = load_config(sys.argv[1]).layout
print(layout.targets_per_node + layout.drafters_per_node)' "$config")
exec torchrun --standalone --nproc-per-node "$nproc" -m ringtrain.main --config "$config" "$@"
