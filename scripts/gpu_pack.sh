#!/usr/bin/env bash
# Here, before a device session: what scripts/gpu_session.sh needs on the device machine, in two
# git-ignored folders that the device call carries (`carry: [".whl", ".gpu"]`, about 10 MB):
#   .whl/            wheels of the packages that machine's image lacks (Python 3.12, x86-64)
#   .gpu/tokenizer/  the default model's tokenizer files (the machine has no default model)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
mkdir -p .git/info
for d in /.whl/ /.gpu/; do grep -qxF "$d" .git/info/exclude 2>/dev/null || echo "$d" >>.git/info/exclude; done
plats=()
for n in 17 24 26 27 28 31 34 35; do plats+=(--platform "manylinux_2_${n}_x86_64"); done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${plats[@]}" --platform manylinux2014_x86_64 -d .whl \
  fastapi==0.165.0 starlette==1.10.0 pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 \
  typing-inspection==0.4.5 typing_extensions==4.16.0 uvicorn==0.55.0 gguf==0.19.0 \
  llguidance==1.9.1 partial-json-parser==0.2.1.1.post7 jsonschema==4.26.0 \
  jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1 redis==8.2.0 \
  pyzmq==27.3.0 opentelemetry-api==1.45.2 anyio==4.16.0
src=$("$PY" -c 'from radixkv.model import default_model_path; print(default_model_path())')
mkdir -p .gpu/tokenizer
for f in tokenizer.json tokenizer_config.json chat_template.jinja; do
  [ -f "$src/$f" ] && cp "$src/$f" .gpu/tokenizer/
done
du -sh .whl .gpu
