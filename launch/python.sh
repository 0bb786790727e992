# Sourced by the launch scripts: `python` is the project's environment (.venv at the
# project root, made by tools/setup_env.sh or launch/quickstart.sh) when there is one,
# else $PYTHON (default python3); the project root ($root) is importable.
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${PYTHON:-python3}
[ -x "$root/.venv/bin/python" ] && python=$root/.venv/bin/python
if ! "$python" -c "import ringtrain" 2> /dev/null; then
    echo "$python cannot import ringtrain: run 'bash tools/setup_env.sh' once (it makes" \
        "$root/.venv), or set PYTHON to an interpreter where ringtrain is installed" >&2
    exit 2
fi
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
