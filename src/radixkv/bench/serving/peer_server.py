"""A peer engine's OpenAI-compatible server (e.g. vLLM) for side-by-side runs.

The peer runs from its own interpreter with an explicit environment; `describe()` returns the
exact command line and the environment variables we set, for the report.
"""

from __future__ import annotations

from pathlib import Path

from radixkv.bench.serving.server_proc import ServerProcess, home_relative

# The KV cache each engine gets in a side-by-side run: vLLM's VLLM_CPU_KVCACHE_SPACE (GiB) and
# our --kv-cache-mb are set from this one figure, so neither engine evicts for lack of a budget
# the other has.
PEER_KV_GIB = 2


def vllm_env(num_cores: int) -> dict[str, str]:
    """vLLM CPU settings for a fair run: every core bound, none reserved (its CPU build keeps
    one of two cores for itself otherwise), loopback only, a 2 GiB KV cache space."""
    return {
        "VLLM_HOST_IP": "127.0.0.1",
        "VLLM_CPU_OMP_THREADS_BIND": f"0-{num_cores - 1}" if num_cores > 1 else "0",
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
        "VLLM_CPU_KVCACHE_SPACE": str(PEER_KV_GIB),
        # Lets the benchmark clients reset the prefix cache after their warm-up.
        "VLLM_SERVER_DEV_MODE": "1",
    }


class PeerServer(ServerProcess):
    """`cmd --host 127.0.0.1 --port P` with `env` added to ours."""

    def __init__(
        self, cmd: list[str], env: dict[str, str], log_path: Path, startup_timeout: float
    ) -> None:
        super().__init__(log_path, startup_timeout, env)
        self.base_cmd = list(cmd)

    @property
    def command(self) -> list[str]:
        return [*self.base_cmd, "--host", "127.0.0.1", "--port", str(self.port)]


def scrub(
    text: str,
    vllm_python: str,
    sglang_python: str | None = None,
    out_dir: str | None = None,
    model_dir: str | None = None,
) -> str:
    """Reports carry no machine paths: the peers' interpreters become $VLLM_PYTHON and
    $SGLANG_PYTHON, the output folder $OUT, a checkpoint given by path $MODEL_DIR (the
    embedded model's lies under home, which becomes ~)."""
    named = [(sglang_python, "$SGLANG_PYTHON"), (vllm_python, "$VLLM_PYTHON"), (out_dir, "$OUT")]
    if model_dir and not model_dir.startswith(str(Path.home())):
        named.append((model_dir, "$MODEL_DIR"))
    # Longest first, so a path inside another is replaced by its own name.
    for path, name in sorted(named, key=lambda pn: -len(pn[0] or "")):
        if path:
            text = text.replace(path, name)
    return home_relative(text)
