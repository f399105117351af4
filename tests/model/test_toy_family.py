"""Adding a model family touches its own module plus one registry line: the test-only family of
tests/model/model_toy_family.py, registered here, is built through the registry from a config
dict and seeded weights (no checkpoint), run through the standalone Session driver (slots in a
seeded random order, ragged prefill, chunks, mixed and batched decode), and checked against a
naive float32 reference written from scratch below. Its standard layers must be served by the
native C++ stack (where the kernels build) with the same bits as its eager layers; its
parallel-block twist must run eagerly, and still match its reference."""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any, cast

import pytest
import torch
import torch.nn.functional as F
from test_native_stack import count_native_calls

from radixkv.model.attention import select_backend
from radixkv.model.families.skeleton import DecoderLM
from radixkv.model.hybrid_simple import Session
from radixkv.model.loader import LoadedModel
from radixkv.model.registry import ARCHITECTURES, Family, family, parse_config

H, HEADS, KV_HEADS, D, FFN, VOCAB, LAYERS, EPS, THETA = 64, 4, 2, 16, 96, 300, 3, 1e-6, 10_000.0
RTOL = 1e-4


@pytest.fixture(autouse=True)
def registered(monkeypatch: pytest.MonkeyPatch) -> None:
    """The one registry line per architecture (here scoped to each test)."""
    monkeypatch.setitem(
        ARCHITECTURES, "ToyForCausalLM", Family("model_toy_family", "ToyConfig", "ToyLM")
    )
    monkeypatch.setitem(
        ARCHITECTURES,
        "ToyParallelForCausalLM",
        Family("model_toy_family", "ToyConfig", "ToyParallelLM"),
    )


def weights(name: str) -> torch.Tensor:
    """A seeded tensor for every weight the family asks for (norm weights near 1)."""
    leaf = name.split(".")[-2]
    shapes = {
        "embed_tokens": (VOCAB, H),
        "lm_head": (VOCAB, H),
        "q_proj": (HEADS * D, H),
        "k_proj": (KV_HEADS * D, H),
        "v_proj": (KV_HEADS * D, H),
        "o_proj": (H, HEADS * D),
        "gate_proj": (FFN, H),
        "up_proj": (FFN, H),
        "down_proj": (H, FFN),
    }
    gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    if leaf in shapes:
        return torch.randn(shapes[leaf], generator=gen) * 0.2
    size = D if leaf in ("q_norm", "k_norm") else H
    return 1 + 0.2 * torch.randn(size, generator=gen)


def build(arch: str, **raw: Any) -> LoadedModel:
    config = parse_config(
        {
            "architectures": [arch],
            "num_hidden_layers": LAYERS,
            "hidden_size": H,
            "intermediate_size": FFN,
            "num_attention_heads": HEADS,
            "num_key_value_heads": KV_HEADS,
            "head_dim": D,
            "vocab_size": VOCAB,
            "rms_norm_eps": EPS,
            "rope_theta": THETA,
            "eos_token_id": 2,
            **raw,
        }
    )
    backend = select_backend("cpu")  # as load_model picks it
    model = family(arch).model_class()(config, weights, attention=backend).eval()
    return LoadedModel(model, config, cast(Any, None), Path("."))


def _norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w


def _rope(x: torch.Tensor) -> torch.Tensor:
    """Half-rotation RoPE of x [T, heads, D] at positions 0..T-1."""
    pos = torch.arange(x.shape[0], dtype=torch.float32)
    inv = 1.0 / THETA ** (torch.arange(0, D, 2, dtype=torch.float32) / D)
    ang = torch.cat([pos[:, None] * inv] * 2, dim=-1)[:, None, :]
    x1, x2 = x[..., : D // 2], x[..., D // 2 :]
    return x * ang.cos() + torch.cat([-x2, x1], dim=-1) * ang.sin()


def _attention(h: torch.Tensor, p: str, window: int | None) -> torch.Tensor:
    t = h.shape[0]
    q = _rope(
        _norm((h @ weights(p + "q_proj.weight").T).view(t, HEADS, D), weights(p + "q_norm.weight"))
    )
    k = _rope(
        _norm(
            (h @ weights(p + "k_proj.weight").T).view(t, KV_HEADS, D), weights(p + "k_norm.weight")
        )
    )
    v = (h @ weights(p + "v_proj.weight").T).view(t, KV_HEADS, D)
    k, v = (z.repeat_interleave(HEADS // KV_HEADS, dim=1) for z in (k, v))
    scores = torch.einsum("qhd,khd->hqk", q, k) * D**-0.5
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    visible = (j <= i) & ((i - j < window) if window else True)
    o = torch.einsum("hqk,khd->qhd", scores.masked_fill(~visible, float("-inf")).softmax(-1), v)
    return o.reshape(t, HEADS * D) @ weights(p + "o_proj.weight").T


def _mlp(h: torch.Tensor, p: str) -> torch.Tensor:
    gate, up = (h @ weights(p + n).T for n in ("gate_proj.weight", "up_proj.weight"))
    return (F.silu(gate) * up) @ weights(p + "down_proj.weight").T


def reference(tokens: list[int], parallel: bool, windows: list[int | None]) -> torch.Tensor:
    """Logits [T, vocab] of the whole sequence, recomputed from the weights."""
    x = weights("model.embed_tokens.weight")[torch.tensor(tokens)]
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        a = _attention(
            _norm(x, weights(p + "input_layernorm.weight")), p + "self_attn.", windows[i]
        )
        mlp_in = x if parallel else x + a
        x = x + a + _mlp(_norm(mlp_in, weights(p + "post_attention_layernorm.weight")), p + "mlp.")
    return _norm(x, weights("model.norm.weight")) @ weights("lm_head.weight").T


def run(lm: LoadedModel, seqs: list[list[int]]) -> list[torch.Tensor]:
    """Per-sequence logits of every token, over ragged prefill, chunks and decodes."""
    sess = Session(lm, num_slots=256, seed=3)
    s = [sess.new(t) for t in seqs]
    out: list[list[torch.Tensor]] = [[] for _ in seqs]
    plan = [[(0, 20), (1, 3)], [(0, 1), (1, 15), (2, 9)], [(0, 1), (1, 1), (2, 1)], [(2, 1)]]
    for work in plan:
        logits = sess.step([(s[r], n) for r, n in work])
        for (r, _), lg in zip(work, logits, strict=True):
            out[r].append(lg)
    return [torch.cat(o) for o in out]


def _tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


SEQS = [_tokens(n, seed=n) for n in (22, 19, 11)]  # what `run` steps through


@pytest.mark.parametrize(
    ("arch", "layer_types"),
    [
        ("ToyForCausalLM", None),
        ("ToyParallelForCausalLM", None),
        ("ToyForCausalLM", ["sliding_attention"] * LAYERS),  # all-sliding: the SWA pool
        ("ToyForCausalLM", ["sliding_attention", "full_attention", "sliding_attention"]),
    ],
)
def test_toy_family_matches_its_reference(arch: str, layer_types: list[str] | None) -> None:
    raw: dict[str, Any] = {}
    windows: list[int | None] = [None] * LAYERS
    if layer_types is not None:
        raw = {"layer_types": layer_types, "sliding_window": 6}
        windows = [6 if t == "sliding_attention" else None for t in layer_types]
    lm = build(arch, **raw)
    for got, toks in zip(run(lm, SEQS), SEQS, strict=True):
        ref = reference(toks, arch == "ToyParallelForCausalLM", windows)
        assert got.shape == ref.shape
        err = float((got - ref).abs().max() / ref.abs().max())
        assert err < RTOL, f"relative error {err:.2e}"


def test_standard_layers_get_the_native_stack_and_the_twist_does_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    toy, parallel = build("ToyForCausalLM"), build("ToyParallelForCausalLM")
    assert cast(DecoderLM[Any], toy.model).supports_compile
    assert not cast(DecoderLM[Any], parallel.model).supports_compile
    assert parallel.model.native_stack() is None
    if toy.model.native_stack() is None:
        pytest.skip("the native stack needs the C++ kernels (AVX-512; see the warning logged)")
    calls = count_native_calls(monkeypatch)
    native = run(toy, SEQS)
    assert len(calls) == 4  # every step of the standard family ran natively
    run(parallel, SEQS)
    assert len(calls) == 4  # the twist never did
    eager = build("ToyForCausalLM")
    eager.model._native = None  # the eager layers
    for a, b in zip(native, run(eager, SEQS), strict=True):
        assert torch.equal(a, b)
