#!/usr/bin/env bash
# Create the project's virtual environment (.venv at the project root, or
# $RINGTRAIN_VENV) on first use and install ringtrain with its test tools into it.
# Prints the venv's directory. Safe to run again: it only installs what is missing.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${RINGTRAIN_VENV:-$root/.venv}
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
    "$py" -m pip install -q --no-compile -e "$root[test]"
    touch "$stamp"
fi
echo "$venv"
