"""One answer per question, kernel by kernel: a token's attention output and a row's projection
are the same bits however the batch, the prompt's chunks or its cached prefix fall.

The C++ kernels promise a fixed reduction order (see `radixkv/model/kernels/decode_canon.h` and
`gemm.cpp`); these tests compare bit patterns (`torch.equal`), not tolerances, and each case
would differ under the earlier kernels (a decode step's scores were summed in another order than
a prefill chunk's, key blocks started where a chunk or window started, and the projection's
blocking depended on the row count)."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch
from gemm_paths import each_path, gemm_module

DTYPES = [torch.float32, torch.bfloat16]


def _module() -> Any:
    from radixkv.model.kernels import cpu_kernels

    module = cpu_kernels()
    if module is None or not module.extend_attention_supported():
        pytest.skip("the C++ kernels need AVX-512 (see the warning logged)")
    return module


def _extend(
    m: Any,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slots: torch.Tensor,
    chunks: list[int],
    window: int,
) -> torch.Tensor:
    """q's rows computed chunk by chunk, each chunk attending to everything before it."""
    out, pos = [], 0
    for c in chunks:
        one = torch.tensor([c])
        out.append(
            m.extend_attention(
                q[pos : pos + c].contiguous(),
                k,
                v,
                slots[: pos + c].contiguous(),
                torch.tensor([0]),
                torch.tensor([0]),
                one,
                torch.tensor([pos]),
                window,
                0.125,
            )
        )
        pos += c
    return torch.cat(out)


def _problem(
    seed: int, dtype: torch.dtype, heads: tuple[int, int, int], length: int, paged: bool = False
) -> tuple:
    """`paged`: the context in pages of 16 consecutive slots, the pages in random order (what a
    page-16 pool gives; the decode kernel reads such keys straight from the pool); else every
    key at a random slot."""
    h, kv, d = heads
    g = torch.Generator().manual_seed(seed)
    n = (length + 40 + 15) // 16 * 16
    pool = torch.randn(2, n, kv, d, generator=g).to(dtype)  # strided rows, as in the pool
    q = torch.randn(length, h, d, generator=g).to(dtype)
    if paged:
        pages = torch.randperm(n // 16, generator=g)
        slots = (pages[:, None] * 16 + torch.arange(16)).reshape(-1)[:length]
    else:
        slots = torch.randperm(n, generator=g)[:length]
    return q, pool[0], pool[1], slots


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", [(9, 3, 64), (4, 1, 128), (6, 2, 16), (8, 2, 256), (24, 1, 32)])
@pytest.mark.parametrize("window", [0, 37, 100])
@pytest.mark.parametrize("paged", [False, True])
def test_attention_is_the_same_whatever_the_chunks(
    dtype: torch.dtype, heads: tuple[int, int, int], window: int, paged: bool
) -> None:
    """Whole prompt vs random chunks (a cached prefix is the same call with the prefix's K/V
    already in the pool) vs the decode kernel for the last positions: equal bits, with keys at
    scattered slots and in pages of 16 consecutive ones."""
    m = _module()
    rng = random.Random(heads[2] + window)
    length = rng.randrange(130, 300)
    q, k, v, slots = _problem(length, dtype, heads, length, paged)
    whole = _extend(m, q, k, v, slots, [length], window)
    cuts = sorted(rng.sample(range(1, length), 5))
    chunks = [b - a for a, b in zip([0, *cuts], [*cuts, length], strict=True)]
    assert torch.equal(_extend(m, q, k, v, slots, chunks, window), whole), chunks
    assert torch.equal(_extend(m, q, k, v, slots, [length - 1, 1], window), whole)
    for p in (length - 70, length - 2, length - 1):
        dec = m.decode_attention(
            q[p : p + 1].contiguous(),
            k,
            v,
            slots[: p + 1].view(1, -1),
            torch.tensor([p + 1]),
            window,
            0.125,
        )
        assert torch.equal(dec[0], whole[p]), p


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", [(9, 3, 64), (4, 1, 256), (6, 2, 16)])
@pytest.mark.parametrize("window", [0, 100, 700])
def test_long_contexts_group_rows_without_changing_bits(
    dtype: torch.dtype, heads: tuple[int, int, int], window: int
) -> None:
    """From 1,024 keys on, the extend kernel works on up to four sub-blocks of query rows per
    item, sharing each key block it loads; a chunk that ends below that length takes one
    sub-block per item. Both, and the decode kernel, give each row the same bits: the whole
    prompt vs chunks that straddle the threshold (odd lengths, so bfloat16's last key pair of a
    sub-block is half a pair while the block loaded for the item goes on)."""
    m = _module()
    rng = random.Random(heads[2] * 7 + window)
    length = rng.randrange(1100, 1400) | 1
    q, k, v, slots = _problem(length + heads[0], dtype, heads, length, paged=True)
    whole = _extend(m, q, k, v, slots, [length], window)
    for chunks in ([1023, length - 1023], [517, 600, length - 1117], [length - 1, 1]):
        assert torch.equal(_extend(m, q, k, v, slots, chunks, window), whole), chunks
    for p in (1022, 1023, 1100, length - 1):
        dec = m.decode_attention(
            q[p : p + 1].contiguous(),
            k,
            v,
            slots[: p + 1].view(1, -1),
            torch.tensor([p + 1]),
            window,
            0.125,
        )
        assert torch.equal(dec[0], whole[p]), p


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads", [(9, 3, 64), (32, 8, 64), (4, 1, 256), (12, 4, 48), (8, 8, 96)])
def test_decode_rows_do_not_depend_on_their_batch(
    dtype: torch.dtype, heads: tuple[int, int, int]
) -> None:
    """A request's decode output alone, on one thread, equals its row among others of other
    lengths, on one thread and on two. The batch size and the threads decide how many KV heads
    one work item takes (one, some or all of a request's, e.g. the 1B shape's 8 KV heads as 1,
    2, 4 or 8), and with them how each key's row is read: never the bits. Head dims 64 and 256
    keep the bfloat16 values in unpacked lane order, 48 and 96 take the other layouts."""
    m = _module()
    q, k, v, _ = _problem(3, dtype, heads, 8)
    g = torch.Generator().manual_seed(4)
    lens = torch.tensor([300, 17, 129, 64, 1, 200, 65, 128])
    slots = torch.randint(0, k.shape[0], (8, 300), generator=g)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = [
            m.decode_attention(
                q[r : r + 1].contiguous(), k, v, slots[r : r + 1], lens[r : r + 1], 0, 0.125
            )[0]
            for r in range(8)
        ]
        for threads in (1, 2):
            torch.set_num_threads(threads)
            for size in (1, 2, 3, 4, 8):
                rows = list(range(8 - size, 8))
                together = m.decode_attention(
                    q[rows].contiguous(), k, v, slots[rows], lens[rows], 0, 0.125
                )
                for i, r in enumerate(rows):
                    assert torch.equal(alone[r], together[i]), (threads, size, r)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("n", "k"), [(960, 576), (33, 18), (49, 1536), (70, 514)])
def test_gemm_rows_do_not_depend_on_the_row_count(dtype: torch.dtype, n: int, k: int) -> None:
    """Every prefix and suffix of a 300-row product, and single rows, equal the whole
    product's rows bit for bit (row tiles of 1-8, row blocks of 96 and 192, K blocks with a
    2-value tail (514 = 2 x 256 + 2), K = 1,536 over 1,024-value blocks, padded N, panels of 3
    and 4 blocks), on every path the CPU serves for the dtype."""
    mod = gemm_module(dtype)
    g = torch.Generator().manual_seed(n + k)
    w = torch.randn(n, k, generator=g).to(dtype)
    bias = torch.randn(n, generator=g)
    packed = mod.gemm_pack(w)
    x = torch.randn(300, k, generator=g).to(dtype)
    for path in each_path(mod, dtype):
        whole = mod.gemm(x, packed, n, bias)
        for rows in (1, 2, 5, 6, 7, 8, 9, 16, 17, 95, 97, 191, 193, 200):
            alone = mod.gemm(x[:rows].contiguous(), packed, n, bias)
            assert torch.equal(alone, whole[:rows]), (path, rows)
            alone = mod.gemm(x[-rows:].contiguous(), packed, n, bias)
            assert torch.equal(alone, whole[-rows:]), (path, rows)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", [300, 576])  # bf16 on AMX: K = 576 takes the tile kernel
@pytest.mark.parametrize("n", [200, 192])  # f32 with whole blocks: the chains run in `out`
def test_gemm_rows_do_not_depend_on_the_threads(dtype: torch.dtype, k: int, n: int) -> None:
    """One thread and two split the output panels differently (and a 3-row product takes wider
    tiles than a 300-row one): the same bits."""
    mod = gemm_module(dtype)
    g = torch.Generator().manual_seed(7)
    w = torch.randn(n, k, generator=g).to(dtype)
    packed = mod.gemm_pack(w)
    x = torch.randn(300, k, generator=g).to(dtype)
    before = torch.get_num_threads()
    for path in each_path(mod, dtype):
        try:
            results = []
            for threads in (1, 2):
                torch.set_num_threads(threads)
                results.append(mod.gemm(x, packed, n, None))
                three = mod.gemm(x[:3].contiguous(), packed, n, None)
                assert torch.equal(three, results[-1][:3]), path
        finally:
            torch.set_num_threads(before)
        assert torch.equal(results[0], results[1]), path
