"""The head-to-head against vLLM (and SGLang's client), run from a checkout:
`python -m scripts.peers --vllm-python PY ...` (docs/vllm.md). Each engine is measured by a
peer's own serving benchmark client and by ours; `table` re-renders a saved JSON."""
