#!/usr/bin/env bash
# The GPU check (see benchmarks/gpu_check.py): `bash benchmarks/gpu_check.sh [--dry-run]`.
# Uses the repository's own .venv when present, else the python on PATH (a CUDA torch build).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" benchmarks/gpu_check.py "$@"
