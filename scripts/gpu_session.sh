#!/usr/bin/env bash
# On a lent device machine (the `device` tool's run, with `carry: [".whl", ".gpu"]` made here by
# scripts/gpu_pack.sh): `bash scripts/gpu_session.sh [gpu_check.py arguments]`. Installs the
# wheels the machine's image lacks into /tmp/site, then runs scripts/gpu_check.sh on the
# default model's shape with seeded random weights (`smollm2-shaped`: the real weights are a
# package too large to carry) and the 1B shape, both built there under /tmp/radixkv-models. The
# log, the JSON and nvidia-smi's line land in $OUT (./gpu-out without one). `gpu_session.sh
# profile [gpu_profile.py arguments]` runs scripts/gpu_profile.py on the 1B shape instead.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 RADIXKV_CACHE_DIR=/tmp/radixkv-models
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv \
  | tee "$OUT/nvidia-smi.txt"
python3 -c 'import torch, triton, transformers; print(torch.__version__, triton.__version__,
transformers.__version__)' | tee -a "$OUT/nvidia-smi.txt"
if [ "${1:-}" = "profile" ]; then  # scripts/gpu_profile.py on the 1B shape instead
  shift
  one_b=$(PYTHONPATH=src:$PYTHONPATH python3 -c 'from radixkv.bench.tiny_model import resolve_model
import sys; print(resolve_model("1b", sys.argv[1]))' .gpu/tokenizer) || exit 4
  PYTHONPATH=src:$PYTHONPATH python3 scripts/gpu_profile.py --model "$one_b" "$@" 2>&1 \
    | tee "$OUT/gpu_profile.log"
  exit
fi
PYTHON=python3 scripts/gpu_check.sh --model smollm2-shaped --tokenizer-dir .gpu/tokenizer \
  --json "$OUT/gpu_check.json" "$@" 2>&1 | tee "$OUT/gpu_check.log"
