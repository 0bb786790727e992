#!/usr/bin/env bash
# Set up the environment if needed and train a drafter on the embedded default:
# a tiny built-in hybrid target and a synthetic dataset, 1 target rank + 2 drafter
# ranks, on CPU or GPU. Extra arguments go to ringtrain.main (e.g. --config FILE).
# Ends by naming the drafter checkpoint and the next two commands (evaluate, plot).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=$("$root/tools/setup_env.sh")
cd "$root"
output=$(mktemp)
trap 'rm -f "$output"' EXIT
code=0
"$venv/bin/python" -m ringtrain.launch --standalone --nproc-per-node 3 "$@" 2>&1 \
    | tee -i "$output" || code=${PIPESTATUS[0]}
checkpoint=$(sed -n 's/.*checkpoint written: //p' "$output" | tail -n 1)
if [ "$code" -ne 0 ] || [ -z "$checkpoint" ]; then
    exit "$code"
fi
run_dir=$(dirname "$(dirname "$checkpoint")")
target=$("$venv/bin/python" - "$run_dir" <<'PY'
import json, sys
from pathlib import Path
run_dir = Path(sys.argv[1])
path = json.loads((run_dir / "config.json").read_text())["target"]["path"]
print(path or run_dir / "builtin" / "target")
PY
)
prompts=$run_dir/eval-prompts.jsonl
if [ ! -f "$prompts" ]; then
    printf '%s\n' \
        '{"messages": [{"role": "user", "content": "Write a haiku about the sea."}]}' \
        '{"messages": [{"role": "user", "content": "Explain what a drafter does."}]}' \
        > "$prompts"
fi
# Paths under the project root are shown relative to it (the commands run from there).
checkpoint=${checkpoint#"$root"/} run_dir=${run_dir#"$root"/} target=${target#"$root"/}
prompts=${prompts#"$root"/} venv=${venv#"$root"/}
cat <<TEXT

drafter: $checkpoint (the newest checkpoint of $run_dir; DFlash inference code loads it)
next:
  evaluate it by real speculative decoding (the built-in target has random weights, so
  expect tau_real near 1; docs/evaluation.md for real targets and benchmarks):
    $venv/bin/ringtrain-eval --target $target --drafter $run_dir --prompts $prompts --max-new-tokens 32
  plot the run (loss, tau, tokens/s, the ring) as one PNG:
    bash tools/setup_env.sh --extras plot && $venv/bin/ringtrain-plot $run_dir -o $run_dir/run.png
TEXT
