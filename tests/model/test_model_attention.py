"""The two torch attention kernels agree, and match a naive per-query reference."""

from __future__ import annotations

import pytest
import torch

from radixkv.engine.batch import ForwardBatch
from radixkv.model.attention import TorchAttention

KV, G, D = 2, 3, 8


def _batch(lens: list[int], extend: list[int], slots: torch.Tensor) -> ForwardBatch:
    ctx, outs, pos, off = [], [], [], 0
    for s, e in zip(lens, extend, strict=True):
        ctx.append(slots[off : off + s])
        outs.append(slots[off + s - e : off + s])
        pos.append(torch.arange(s - e, s))
        off += s
    return ForwardBatch(
        input_ids=torch.zeros(sum(extend), dtype=torch.int64),
        positions=torch.cat(pos),
        out_slots=torch.cat(outs),
        extend_lens=tuple(extend),
        seq_lens=tuple(lens),
        context_slots=tuple(ctx),
    )


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
    got = attn.attend(q, k, v, attn.prepare(batch, torch.device("cpu")), window, D**-0.5)
    torch.testing.assert_close(got, _naive(q, k, v, batch, window), rtol=1e-5, atol=1e-5)


def test_unknown_kernel() -> None:
    with pytest.raises(ValueError, match="kernel"):
        TorchAttention("flash")


def test_windowed_layers_gather_only_visible_keys() -> None:
    slots = torch.randperm(40)
    decode = TorchAttention().prepare(_batch([3, 10, 7], [1, 1, 1], slots), torch.device("cpu"))
    assert decode.decode is not None
    assert decode.decode.view(None).width == 10
    view = decode.decode.view(4)
    assert view.width == 4
    assert view.valid.sum(1).tolist() == [3, 4, 4]
    assert view.slots.view(3, 4)[1].tolist() == slots[3 + 6 : 3 + 10].tolist()
    extend = TorchAttention().prepare(_batch([12], [5], slots), torch.device("cpu"))
    item = extend.extends[0]
    assert (item.first_key(None), item.first_key(4), item.first_key(100)) == (0, 4, 0)


def test_from_contexts_derives_positions_and_out_slots() -> None:
    lens, extend = [7, 3, 12], [2, 3, 1]
    slots = torch.randperm(40)
    explicit = _batch(lens, extend, slots)
    offsets = [0, 7, 10]
    ctx = [slots[o : o + n] for o, n in zip(offsets, lens, strict=True)]
    derived = ForwardBatch.from_contexts(explicit.input_ids, ctx, extend)
    assert derived.seq_lens == explicit.seq_lens and derived.extend_lens == explicit.extend_lens
    assert torch.equal(derived.positions, explicit.positions)
    assert torch.equal(derived.out_slots, explicit.out_slots)
    assert all(
        torch.equal(a, b)
        for a, b in zip(derived.context_slots, explicit.context_slots, strict=True)
    )
