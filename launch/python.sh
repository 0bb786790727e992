# Sourced by the launch scripts: `python` is the project's environment ($RINGTRAIN_VENV,
# default .venv at the project root, as tools/setup_env.sh and launch/quickstart.sh make
# it) when there is one, else $PYTHON (default python3); the project root ($root) is
# importable.
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${PYTHON:-python3}
venv=${RINGTRAIN_VENV:-$root/.venv}
[ -x "$venv/bin/python" ] && python=$venv/bin/python
if ! "$python" -c "import ringtrain" 2> /dev/null; then
    echo "$python cannot import ringtrain: run 'bash tools/setup_env.sh' once (it makes" \
        "$venv), or set PYTHON to an interpreter where ringtrain is installed" >&2
    exit 2
fi
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
