"""Hybrid model plumbing: layer kinds and pool specs per family, the StatePool, batch validation,
and the DeltaNet chunked form against its recurrent form."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from radixkv.memory.hybrid import (
    FULL,
    STATE,
    SWA,
    KVGroupSpec,
    ModelPools,
    PoolSpec,
    StateGroupSpec,
)
from radixkv.memory.pool import KVPool
from radixkv.memory.state_pool import StateLayerSpec, StatePool, StateTensorSpec
from radixkv.model import UnsupportedArchitectureError, load_model
from radixkv.model.batch import ForwardBatch
from radixkv.model.config import LlamaConfig, kind_indices, layer_kinds
from radixkv.model.families.deltanet import chunked, prepare_qk, recurrent_step
from radixkv.model.registry import load_config


def test_layer_kinds_from_hf_fields() -> None:
    raw = {"layer_types": ["full_attention", "sliding_attention", "linear_attention", "conv"]}
    assert layer_kinds(raw, 4) == ("full", "swa", "state", "state")
    assert layer_kinds({"sliding_window": 16}, 3) == ("swa",) * 3
    assert layer_kinds({}, 2) == ("full", "full")
    assert kind_indices(("swa", "full", "swa", "state", "swa")) == (0, 0, 1, 0, 2)
    with pytest.raises(UnsupportedArchitectureError, match="layer types"):
        layer_kinds({"layer_types": ["moe_thing"]}, 1)


def test_llama_family_components() -> None:
    base = {
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "intermediate_size": 128,
        "vocab_size": 100,
    }
    mistral = LlamaConfig.from_dict(
        {**base, "architectures": ["MistralForCausalLM"], "sliding_window": 8}
    )
    assert mistral.pool_spec() == PoolSpec({SWA: KVGroupSpec(2, 4, 16, window=8)})
    llama = LlamaConfig.from_dict({**base, "architectures": ["LlamaForCausalLM"]})
    assert llama.pool_spec() == PoolSpec({FULL: KVGroupSpec(2, 4, 16)})
    # Qwen2 mixing full and windowed layers stays FULL-only (the window is applied by attention).
    qwen2 = LlamaConfig.from_dict(
        {
            **base,
            "architectures": ["Qwen2ForCausalLM"],
            "use_sliding_window": True,
            "sliding_window": 8,
            "max_window_layers": 1,
        }
    )
    assert qwen2.layer_windows == (None, 8) and qwen2.pool_spec() == llama.pool_spec()
    with pytest.raises(UnsupportedArchitectureError, match="Gemma3ForCausalLM"):
        LlamaConfig.from_dict({**base, "architectures": ["Phi3ForCausalLM"]})


def test_family_pool_specs(tiny_model_dir: Callable[..., Path]) -> None:
    gemma = load_config(tiny_model_dir("gemma3")).pool_spec()
    assert gemma == PoolSpec({FULL: KVGroupSpec(1, 2, 16), SWA: KVGroupSpec(3, 2, 16, window=8)})
    assert gemma.window(SWA) == 8 and gemma.window(FULL) is None and gemma.window(STATE) is None
    assert gemma.attention_kinds == (FULL, SWA)
    f32 = torch.float32
    assert gemma.slot_bytes(FULL, f32) == 2 * 2 * 16 * 4  # K and V, 2 heads of 16, float32
    assert gemma.slot_bytes(SWA, f32) == 3 * 2 * 2 * 16 * 4  # 3 sliding layers
    assert gemma.slot_bytes(STATE, f32) == 0  # a kind the model has no layers of
    qwen = load_config(tiny_model_dir("qwen3_5"))
    spec = qwen.pool_spec()
    assert spec.kinds == (FULL, STATE) and spec.attention_kinds == (FULL,)
    assert spec[FULL].num_layers == 1 and spec[STATE].num_layers == 2
    state = spec[STATE]
    assert isinstance(state, StateGroupSpec)
    conv, rec = state.layers[0].tensors
    assert conv.shape == (2 * 2 * 16 + 4 * 16, 3) and rec.shape == (4, 16, 16)
    assert rec.dtype == torch.float32  # recurrent state accumulates: pinned to float32
    per_layer = (128 * 3) * 2 + 4 * 16 * 16 * 4  # conv in bf16, recurrent in f32
    assert spec.slot_bytes(STATE, torch.bfloat16) == 2 * per_layer
    lfm = load_config(tiny_model_dir("lfm2")).pool_spec()
    lfm_state = lfm[STATE]
    assert isinstance(lfm_state, StateGroupSpec) and lfm[FULL].num_layers == 1
    assert lfm_state.layers[0].tensors[0].shape == (64, 2)


def test_pool_spec_is_a_map_of_layer_groups() -> None:
    """`PoolSpec` is what each kind's group says: no kind is named by it, a group without
    layers is refused, pools come out in the groups' order and of each group's shape."""
    state = StateGroupSpec((StateLayerSpec((StateTensorSpec("h", (3,)),)),))
    spec = PoolSpec({STATE: state, FULL: KVGroupSpec(2, 1, 4)})  # the order is the caller's
    assert spec.kinds == (STATE, FULL) and STATE in spec and SWA not in spec
    assert spec.get(SWA) is None and spec[STATE] is state
    pools = spec.make_pools({FULL: 8, STATE: 3, SWA: 99})  # a size for a kind it lacks: ignored
    assert pools.kinds == (STATE, FULL)
    full, st = pools.kv(FULL), pools.state()
    assert full is not None and st is not None
    assert len(full.k) == 2 and full.k[0].shape == (8, 1, 4) and st.tensors[0]["h"].shape == (3, 3)
    assert spec.slot_bytes(FULL, torch.float32) == full.config.bytes_per_slot == 2 * 2 * 4 * 4
    assert spec.slot_bytes(STATE, torch.float32) == st.config.bytes_per_slot == 3 * 4
    with pytest.raises(ValueError, match="no pool size"):
        spec.make_pools({FULL: 8})
    with pytest.raises(ValueError, match="no layers"):
        PoolSpec({FULL: KVGroupSpec(2, 1, 4), SWA: KVGroupSpec(0, 1, 4, window=8)})
    with pytest.raises(ValueError, match="window must be positive"):
        KVGroupSpec(1, 1, 4, window=0)


def test_state_pool_copy_clear() -> None:
    layer = StateLayerSpec(
        (StateTensorSpec("a", (2, 3)), StateTensorSpec("b", (4,), torch.float32))
    )
    pool = StateGroupSpec((layer, layer)).make_pool(5, torch.bfloat16, "cpu")
    assert isinstance(pool, StatePool)
    assert (
        pool.tensors[0]["a"].dtype == torch.bfloat16 and pool.tensors[1]["b"].dtype == torch.float32
    )
    for j, layer_t in enumerate(pool.tensors):
        for t in layer_t.values():
            t.copy_(torch.arange(5).view(5, *([1] * (t.dim() - 1))).expand_as(t) + 10 * j)
    pool.copy_state(1, 3)
    assert all(
        float(t[3].max()) == 1 + 10 * j for j, lt in enumerate(pool.tensors) for t in lt.values()
    )
    pool.copy_states(torch.tensor([4, 0]), torch.tensor([1, 2]))
    assert float(pool.tensors[1]["b"][1, 0]) == 14 and float(pool.tensors[1]["b"][2, 0]) == 10
    pool.clear(torch.tensor([0, 4]))
    assert (
        float(pool.tensors[0]["a"][[0, 4]].abs().sum()) == 0
        and float(pool.tensors[0]["a"][3, 0, 0]) == 1
    )
    assert pool.config.bytes_per_slot == 2 * (6 * 2 + 4 * 4)


def test_hybrid_batch_errors(tiny_model_dir: Callable[..., Path]) -> None:
    lm = load_model(tiny_model_dir("qwen3_5"))
    spec = lm.config.pool_spec()
    pools = spec.make_pools({FULL: 16, STATE: 2})
    slots = [torch.arange(3), torch.arange(3, 6)]
    batch = ForwardBatch.from_contexts(
        [5, 6, 7, 8, 9, 10], slots, [3, 3], kind_slots={STATE: [0, 1]}
    )
    assert lm.model(batch, pools).shape == (2, lm.config.vocab_size)
    with pytest.raises(TypeError, match="ModelPools"):
        lm.model(batch, KVPool(lm.config.pool_config(16)))
    with pytest.raises(ValueError, match="state slot"):
        lm.model(ForwardBatch.from_contexts([5, 6, 7, 8, 9, 10], slots, [3, 3]), pools)
    with pytest.raises(ValueError, match="share"):
        lm.model(
            ForwardBatch.from_contexts([5] * 6, slots, [3, 3], kind_slots={STATE: [1, 1]}), pools
        )
    with pytest.raises(ValueError, match="a STATE pool is required"):
        lm.model(batch, ModelPools({FULL: pools[FULL]}))
    gemma = load_model(tiny_model_dir("gemma3"))
    gpools = gemma.config.pool_spec().make_pools({FULL: 16, SWA: 16})
    with pytest.raises(ValueError, match="swa slot table"):
        gemma.model(ForwardBatch.from_contexts([5, 6, 7], [torch.arange(3)], [3]), gpools)
    with pytest.raises(ValueError, match="cover the context"):
        ForwardBatch.from_contexts([5], [torch.arange(3)], [1], kind_slots={SWA: [torch.arange(2)]})


def test_deltanet_chunked_equals_recurrent() -> None:
    """The chunked form (several chunk sizes, ragged last chunk) against the token-by-token form,
    from a non-zero initial state, with grouped key heads."""
    g = torch.Generator().manual_seed(0)
    t, hk, hv, dk, dv = 37, 2, 4, 8, 6
    q, k = prepare_qk(torch.randn(t, hk, dk, generator=g), torch.randn(t, hk, dk, generator=g), hv)
    v = torch.randn(t, hv, dv, generator=g)
    gate = -torch.rand(t, hv, generator=g) * 3
    beta = torch.rand(t, hv, generator=g)
    s0 = torch.randn(hv, dk, dv, generator=g)
    outs, s = [], s0[None]
    for i in range(t):
        o, s = recurrent_step(
            q[i : i + 1], k[i : i + 1], v[i : i + 1], gate[i : i + 1], beta[i : i + 1], s
        )
        outs.append(o)
    want = torch.cat(outs)
    for chunk in (1, 5, 16, 64):
        got, s_end = chunked(q, k, v, gate, beta, s0, chunk=chunk)
        assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)
        assert torch.allclose(s_end, s[0], atol=1e-4, rtol=1e-4)


def test_qwen3_next_layout(tiny_model_dir: Callable[..., Path]) -> None:
    """MoE on the sparse grid except mlp_only_layers; fused DeltaNet projections all consumed."""
    from radixkv.model.families.qwen3_next import SparseMoE
    from radixkv.model.nn.blocks import GatedMLP

    lm = load_model(tiny_model_dir("qwen3_next"))  # raises if a checkpoint tensor went unused
    mlps = [type(layer.mlp) for layer in lm.model.layers]
    assert mlps == [SparseMoE, SparseMoE, GatedMLP]
    spec = lm.config.pool_spec()
    assert spec.kinds == (FULL, STATE) and spec[FULL].num_layers == 1
    assert spec[STATE].num_layers == 2
