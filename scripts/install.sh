#!/usr/bin/env bash
# Idempotent CPU install into ./.venv: the CPU build of torch first (a bare `torch` requirement
# would pull a multi-GB CUDA build), then this project with its test extra.
# GPU users: create the venv with your own torch (and `pip install -e ".[gpu]"`) instead.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
  .venv/bin/python -m pip install --quiet --upgrade pip
fi
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  .venv/bin/python -m pip install --quiet "torch==2.13.0"
fi
stamp=.venv/.copc-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install --quiet -e ".[test]"
  touch "$stamp"
fi
