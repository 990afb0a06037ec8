#!/bin/sh
# The Python that runs the pipeline: dvc.yaml's stage commands are `./py -m flows.<stage>`.
# It is the project's .venv/bin/python when that exists (next to this file), else the `python`
# on PATH (an activated venv, a conda env, ...), else `python3`. So `.venv/bin/dvc repro` and
# `.venv/bin/dvc exp run` work from a shell where the venv is not activated.
venv_python="$(dirname -- "$0")/.venv/bin/python"
if [ -x "$venv_python" ]; then
    exec "$venv_python" "$@"
elif command -v python >/dev/null 2>&1; then
    exec python "$@"
else
    exec python3 "$@"
fi
