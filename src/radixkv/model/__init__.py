"""radixkv.model: Llama-family checkpoints (Llama/SmolLM2, Qwen2, Qwen3, Mistral) over the KV pool,
and hybrid ones (Gemma 3, Qwen3.5, Qwen3-Next, LFM2) over component pools (memory.hybrid), all on
one model skeleton (radixkv.model.families.skeleton) and one config base (config.ModelConfig);
radixkv.model.registry is the table of architectures.

Usage::

    from radixkv.model import load_model
    from radixkv.memory.pool import KVPool

    lm = load_model(None)               # None → embedded SmolLM2-135M-Instruct (converted once)
    lm = load_model("/path/to/hf_dir", device="cpu", dtype=torch.float32)
    pool = KVPool(lm.config.pool_config(num_slots=4096, dtype=lm.dtype, device="cpu"))
    logits = lm.model(batch, pool)      # batch: radixkv.model.batch.ForwardBatch
    # float32 [R, vocab] (last new token of each request) or [T, vocab] if batch.return_all_logits

    ids = lm.tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}])
    dec = lm.tokenizer.make_decoder()   # dec.push(token_id) -> new stable text; dec.flush()
    lm.tokenizer.eos_token_ids          # also lm.config.eos_token_ids
    lm.generation_config                # dict from generation_config.json ({} if absent)

Each attention layer hands its new tokens' K/V to the attention backend (radixkv.model.attention),
which writes them at `batch.out_slots`, then attends over request r's context
`batch.slot_table[r, :seq_lens[r]]` with causal masking by position (and the layer's sliding
window). Other
architectures raise `UnsupportedArchitectureError` naming them.

Hybrid models (and any model, given ModelPools)::

    spec = lm.config.pool_spec()        # FULL / SWA layer counts, window, state tensors per layer
    pools = spec.make_pools({"full": n, "swa": n_swa, "state": n_states}, lm.dtype, "cpu")
    logits = lm.model(batch, pools)     # batch.kind_slots: the SWA table, state slots

See radixkv.model.batch.ForwardBatch for what each component reads and writes, and
radixkv.model.hybrid_simple.Session for a standalone driver.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from radixkv.model.config import LlamaConfig, UnsupportedArchitectureError

if TYPE_CHECKING:
    from radixkv.model.checkpoints.default import default_model_path
    from radixkv.model.loader import LoadedModel, load_model
    from radixkv.model.tokenizer import Tokenizer

__all__ = [
    "LlamaConfig",
    "LoadedModel",
    "Tokenizer",
    "UnsupportedArchitectureError",
    "default_model_path",
    "load_model",
]


def __getattr__(name: str) -> Any:
    # Lazy so that `radixkv.model.config` users do not pay for the tokenizer/jinja imports.
    if name in ("LoadedModel", "load_model"):
        from radixkv.model import loader

        return getattr(loader, name)
    if name == "Tokenizer":
        from radixkv.model.tokenizer import Tokenizer

        return Tokenizer
    if name == "default_model_path":
        from radixkv.model.checkpoints.default import default_model_path

        return default_model_path
    raise AttributeError(name)
