"""A peer engine's OpenAI-compatible server (e.g. vLLM) for side-by-side runs.

The peer runs from its own interpreter with an explicit environment; `describe()` returns the
exact command line and the environment variables we set, for the report.
"""

from __future__ import annotations

from pathlib import Path

from radixkv.bench.server_proc import ServerProcess


def vllm_env(num_cores: int) -> dict[str, str]:
    """vLLM CPU settings for a fair run: every core bound, none reserved (its CPU build keeps
    one of two cores for itself otherwise), loopback only, a 2 GiB KV cache space."""
    return {
        "VLLM_HOST_IP": "127.0.0.1",
        "VLLM_CPU_OMP_THREADS_BIND": f"0-{num_cores - 1}" if num_cores > 1 else "0",
        "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
        "VLLM_CPU_KVCACHE_SPACE": "2",
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
