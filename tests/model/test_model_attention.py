"""The two torch attention kernels agree, and match a naive per-query reference."""

from __future__ import annotations

import pytest
import torch

from radixkv.model.attention import TorchAttention
from radixkv.model.batch import ForwardBatch

KV, G, D = 2, 3, 8


def _batch(lens: list[int], extend: list[int], slots: torch.Tensor) -> ForwardBatch:
    ctx, off = [], 0
    for s in lens:
        ctx.append(slots[off : off + s])
        off += s
    return ForwardBatch.from_contexts(torch.zeros(sum(extend), dtype=torch.int64), ctx, extend)


def _naive(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, b: ForwardBatch, window: int | None
) -> torch.Tensor:
    out, row = [], 0
    for r, e in enumerate(b.extend_lens):
        ks, vs = k[b.context_slots[r]], v[b.context_slots[r]]
        for _ in range(e):
            p = int(b.positions[row])
            lo = 0 if window is None else max(0, p - window + 1)
            for h in range(KV * G):
                kh, vh = ks[lo : p + 1, h // G], vs[lo : p + 1, h // G]
                w = torch.softmax((kh @ q[row, h]) * D**-0.5, dim=0)
                out.append(w @ vh)
            row += 1
    return torch.stack(out).view(-1, KV * G, D)


@pytest.mark.parametrize("window", [None, 4])
@pytest.mark.parametrize("kernel", ["sdpa", "matmul"])
@pytest.mark.parametrize(
    ("lens", "extend"),
    [([9], [9]), ([12], [5]), ([3, 10, 7], [1, 1, 1]), ([6, 11, 4, 9], [6, 1, 4, 1])],
)
def test_kernels_match_naive(
    kernel: str, window: int | None, lens: list[int], extend: list[int]
) -> None:
    g = torch.Generator().manual_seed(sum(lens))
    num_slots = sum(lens) + 5
    slots = torch.randperm(num_slots, generator=g)
    batch = _batch(lens, extend, slots)
    k = torch.randn(num_slots, KV, D, generator=g)
    v = torch.randn(num_slots, KV, D, generator=g)
    q = torch.randn(batch.num_tokens, KV * G, D, generator=g)
    attn = TorchAttention(kernel)
    got = attn.attend(q, k, v, attn.prepare(batch), window, D**-0.5)
    torch.testing.assert_close(got, _naive(q, k, v, batch, window), rtol=1e-5, atol=1e-5)


def _cpp_kernel():  # type: ignore[no-untyped-def]
    from radixkv.model.kernels import decode_attention

    kernel = decode_attention()
    assert kernel is not None, "the C++ decode kernel failed to build (see the warning logged)"
    return kernel


@pytest.mark.parametrize("window", [None, 4])
@pytest.mark.parametrize(
    ("lens", "extend"), [([3, 10, 7], [1, 1, 1]), ([6, 11, 4, 9], [6, 1, 4, 1]), ([1], [1])]
)
def test_cpp_decode_kernel_matches_naive(
    window: int | None, lens: list[int], extend: list[int]
) -> None:
    """The C++ decode path (K/V read in place by slot) against the naive reference, in the
    pure-decode and the mixed decode + extend batches; head_dim 8 takes its scalar loop."""
    g = torch.Generator().manual_seed(7 + sum(lens))
    num_slots = sum(lens) + 5
    slots = torch.randperm(num_slots, generator=g)
    batch = _batch(lens, extend, slots)
    k = torch.randn(num_slots, KV, D, generator=g)
    v = torch.randn(num_slots, KV, D, generator=g)
    q = torch.randn(batch.num_tokens, KV * G, D, generator=g)
    attn = TorchAttention("sdpa", _cpp_kernel())
    got = attn.attend(q, k, v, attn.prepare(batch), window, D**-0.5)
    torch.testing.assert_close(got, _naive(q, k, v, batch, window), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("head_dim", [16, 32, 40, 48, 64, 80, 96, 128, 256])
@pytest.mark.parametrize(("r", "grp"), [(5, 3), (1, 3), (5, 1), (4, 8), (4, 3), (6, 2)])
def test_cpp_decode_kernel_wide_heads(dtype: torch.dtype, head_dim: int, r: int, grp: int) -> None:
    """head_dim a multiple of 16 takes the vector path (keys in blocks of 64, 16 keys' rows
    transposed per group, values accumulated over groups of query heads, in passes over the head
    dim when it is not 16 x a power of two (48, 80, 96); bf16 as VDPBF16PS pairs where the CPU
    has them), 40 the scalar loop. 4 and 6 requests whose KV heads' query heads fit one item
    take whole-request items on an even thread count. K/V are one layer's rows of a larger pool
    tensor, so rows are strided as in the engine's pool; context lengths cover partial blocks."""
    kernel = _cpp_kernel()
    g = torch.Generator().manual_seed(head_dim + r + grp)
    kv, n = 3, 200
    pool = torch.randn(2, n, kv, head_dim, generator=g).to(dtype)
    k, v = pool[0], pool[1]
    lens = torch.tensor([100, 17, 64, 1, 33, 99][:r])
    slots = torch.stack([torch.randperm(n, generator=g)[:100] for _ in range(r)])
    q = torch.randn(r, kv * grp, head_dim, generator=g).to(dtype)
    got = kernel(q, k, v, slots, lens, 0, head_dim**-0.5).float()
    for i in range(r):
        ks = k[slots[i, : lens[i]]].float()
        vs = v[slots[i, : lens[i]]].float()
        for h in range(kv * grp):
            w = torch.softmax(ks[:, h // grp] @ q[i, h].float() * head_dim**-0.5, dim=0)
            tol = 1e-5 if dtype == torch.float32 else 2e-2
            torch.testing.assert_close(got[i, h], w @ vs[:, h // grp], rtol=tol, atol=tol)


def test_cpp_decode_kernel_rejects_bad_input() -> None:
    kernel = _cpp_kernel()
    q, kv = torch.randn(2, 4, 8), torch.randn(10, 3, 8)
    lens, slots = torch.tensor([1, 1]), torch.zeros(2, 1, dtype=torch.int64)
    with pytest.raises(RuntimeError, match="multiple of KV heads"):
        kernel(q, kv, kv, slots, lens, 0, 1.0)
    with pytest.raises(RuntimeError, match="int64"):
        kernel(torch.randn(2, 3, 8), kv, kv, slots.int(), lens, 0, 1.0)


def test_unknown_kernel() -> None:
    with pytest.raises(ValueError, match="kernel"):
        TorchAttention("flash")


def test_windowed_layers_gather_only_visible_keys() -> None:
    slots = torch.randperm(40)
    decode = TorchAttention().prepare(_batch([3, 10, 7], [1, 1, 1], slots))
    assert decode.decode is not None
    assert decode.decode.view(None).width == 10
    view = decode.decode.view(4)
    assert view.width == 4
    assert view.valid.sum(1).tolist() == [3, 4, 4]
    assert view.slots.view(3, 4)[1].tolist() == slots[3 + 6 : 3 + 10].tolist()
    assert view.slots.view(3, 4)[0].tolist() == [*slots[:3].tolist(), 0]  # padding: slot 0
    extend = TorchAttention().prepare(_batch([12], [5], slots))
    item = extend.extend_items()[0]
    assert (item.first_key(None), item.first_key(4), item.first_key(100)) == (0, 4, 0)


def test_from_contexts_derives_positions_and_out_slots() -> None:
    """The batch's tensors against values written out by hand: three requests with contexts of
    7, 3 and 12 slots extending by 2, 3 and 1."""
    lens, extend = [7, 3, 12], [2, 3, 1]
    slots = torch.randperm(40)
    ctx = [slots[0:7], slots[7:10], slots[10:22]]
    b = ForwardBatch.from_contexts(torch.arange(6), ctx, extend)
    assert b.seq_lens == (7, 3, 12) and b.extend_lens == (2, 3, 1) and b.prefix_lens == (5, 0, 11)
    assert b.seq_lens_t.tolist() == [7, 3, 12] and b.prefix_lens_t.tolist() == [5, 0, 11]
    assert b.extend_lens_t.tolist() == extend and b.q_start.tolist() == [0, 2, 5, 6]
    assert b.positions.tolist() == [5, 6, 0, 1, 2, 11]
    want_out = [*slots[5:7].tolist(), *slots[7:10].tolist(), int(slots[21])]
    assert b.out_slots.tolist() == want_out
    assert b.slot_table.shape == (3, 12)
    for r, c in enumerate(ctx):
        assert b.slot_table[r, : len(c)].tolist() == c.tolist()
        assert torch.equal(b.context_slots[r], c)
    same = ForwardBatch.from_table(torch.arange(6), b.slot_table, extend, lens)
    for name in ("positions", "out_slots", "slot_table", "q_start", "prefix_lens_t"):
        assert torch.equal(getattr(same, name), getattr(b, name)), name
    with pytest.raises(ValueError, match="narrower"):
        ForwardBatch.from_table(torch.arange(6), b.slot_table[:, :8], extend, lens)


def _cpp_extend():  # type: ignore[no-untyped-def]
    from radixkv.model.kernels import extend_attention

    kernel = extend_attention()
    assert kernel is not None, "the C++ extend kernel failed to build (see the warning logged)"
    return kernel


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [None, 4, 70])
@pytest.mark.parametrize(
    ("lens", "extend"),
    [
        ([9], [9]),  # a fresh prompt
        ([150], [130]),  # after a 20-token cached prefix; several query and key blocks
        ([6, 11, 4, 9], [6, 1, 4, 1]),  # mixed with decodes
        ([300, 2, 65], [300, 2, 64]),  # the causal triangle over 5 key blocks
    ],
)
@pytest.mark.parametrize(("kv", "grp", "head_dim"), [(2, 3, 16), (3, 3, 64), (1, 4, 128)])
def test_cpp_extend_kernel_matches_naive(
    dtype: torch.dtype,
    window: int | None,
    lens: list[int],
    extend: list[int],
    kv: int,
    grp: int,
    head_dim: int,
) -> None:
    """The C++ extend kernel (every multi-token request of the forward in one call, K/V read in
    place from one layer of a larger pool) against a float64 per-query reference; decode rows
    of a mixed batch go through the decode path as before."""
    g = torch.Generator().manual_seed(sum(lens) + head_dim)
    n = sum(lens) + 5
    slots = torch.randperm(n, generator=g)
    batch = _batch(lens, extend, slots)
    pool = torch.randn(2, n, kv, head_dim, generator=g).to(dtype)
    k, v = pool[0], pool[1]
    q = torch.randn(batch.num_tokens, kv * grp, head_dim, generator=g).to(dtype)
    attn = TorchAttention("sdpa", _cpp_kernel(), _cpp_extend())
    meta = attn.prepare(batch)
    assert meta.packed is not None
    got = attn.attend(q, k, v, meta, window, head_dim**-0.5).double()
    want, row = [], 0
    for r, e in enumerate(batch.extend_lens):
        ks, vs = k[batch.context_slots[r]].double(), v[batch.context_slots[r]].double()
        for _ in range(e):
            p = int(batch.positions[row])
            lo = 0 if window is None else max(0, p - window + 1)
            for h in range(kv * grp):
                w = torch.softmax(ks[lo : p + 1, h // grp] @ q[row, h].double() * head_dim**-0.5, 0)
                want.append(w @ vs[lo : p + 1, h // grp])
            row += 1
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got, torch.stack(want).view_as(got), rtol=tol, atol=tol)


def test_cpp_extend_kernel_rejects_bad_input() -> None:
    kernel = _cpp_extend()
    ints = torch.tensor([0])
    q, kv = torch.randn(3, 4, 16), torch.randn(10, 3, 16)
    with pytest.raises(RuntimeError, match="multiple of KV heads"):
        kernel(q, kv, kv, torch.arange(3), ints, ints, torch.tensor([3]), ints, 0, 1.0)
    q, kv = torch.randn(3, 3, 8), torch.randn(10, 3, 8)
    with pytest.raises(RuntimeError, match="multiple of 16"):
        kernel(q, kv, kv, torch.arange(3), ints, ints, torch.tensor([3]), ints, 0, 1.0)
    q, kv = torch.randn(3, 3, 16), torch.randn(10, 3, 16)
    with pytest.raises(RuntimeError, match="int64"):
        kernel(q, kv, kv, torch.arange(3).int(), ints, ints, torch.tensor([3]), ints, 0, 1.0)
