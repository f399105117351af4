#!/usr/bin/env bash
# Accelerator check (<= 8 minutes): the Triton kernels, decode CUDA graphs (1B shape: graph == eager,
# step time with and without graphs), exactness vs transformers on the device (float32 and
# bfloat16, eager and compiled), `radixkv bench engine`, and a short serving benchmark.
#   scripts/gpu_check.sh                      # cuda, results in gpu_check.json
#   scripts/gpu_check.sh --device cpu         # the same path on CPU (dry run)
# Extra arguments go to `scripts/gpu_check.py` (see --help).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-}"
if [[ -z "$PY" ]]; then
  if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python3; fi
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
exec timeout 480 "$PY" scripts/gpu_check.py --compile --deadline-s 420 --json gpu_check.json "$@"
