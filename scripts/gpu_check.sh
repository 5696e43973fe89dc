#!/usr/bin/env bash
# The GPU check of the HF/vLLM backends, as one short script (a CUDA machine with vLLM installed:
# `pip install -e '.[gpu,test]'`). Builds a tiny HF model from a config (no download), then runs the
# `vllm` tests on the GPU (vLLM sampling with per-token log-probs vs the learner after every weight
# sync, the sync's timeout, a few COPC steps and a short Ray run with vLLM rollouts) and one short
# `copc train` with the vLLM engine. On a CPU machine the same tests run in the vLLM-on-CPU lane
# (scripts/install_vllm_cpu.sh; docs/SCALE_OUT.md).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
export HF_HUB_OFFLINE=1
$PY -c "import torch, vllm; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'vllm', vllm.__version__)"
COPC_REQUIRE_VLLM=1 $PY -m pytest -q -m vllm -rA tests/test_vllm_engine.py
OUT=${OUT:-$(mktemp -d)}
$PY -m flows.cli hf-tiny "$OUT/tiny-hf"
cat > "$OUT/run.json" <<JSON
{"model": {"backend": "hf", "hf_model": "$OUT/tiny-hf", "device": "cuda", "rollout_engine": "vllm",
           "vllm_gpu_memory_utilization": 0.3},
 "warm_start": {"steps": 200}, "train": {"steps": 20, "staleness": 2, "eval_every": 10}}
JSON
COPC_DATA_DIR="$OUT/data" $PY -m flows.cli train --config "$OUT/run.json" | tail -3
