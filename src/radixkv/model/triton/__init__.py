"""Paged attention in Triton: the attention kernels of a CUDA backend, over the same KV pool and
slot (or page) tables the CPU kernels read.

    from radixkv.model.triton.paged_attention import extend_attention, decode_attention
    out = extend_attention(q, k_cache, v_cache, slot_table, seq_lens, q_start, scale=D**-0.5)
    out = decode_attention(q, k_cache, v_cache, slot_table, seq_lens, scale=D**-0.5,
                           max_seq_len=longest_context)

- `extend_attention`: prefill, chunked prefill and decode rows in one ragged batch; each new
  token sees its request's context up to its own position (causal inside the new tokens, after
  any cached prefix), optionally within a sliding window (key p visible to the query at q iff
  p <= q and p > q - window, Hugging Face's rule); grouped-query attention without repeating
  K/V (a tile's rows are (token, query head) pairs of one KV head, as in the CPU kernel).
- `decode_attention`: one token per request, the keys split at fixed absolute positions
  (multiples of KV_SPLIT = 512) over parallel programs, the parts folded by a second kernel.
- `paged_attention`: both, with the number of parts given.
Inputs are tensors only (see paged_attention's docstring), nothing is read back to the host, so
a backend can prepare them once per step and a CUDA graph can capture a decode call.

One answer per row. A row's output is the same bits whatever the batch around it, however its
prompt was chunked, whether its prefix came from the cache, and whichever launcher ran it (within
one GPU model, driver and Triton build), because:
- one kernel computes every row's partial results (`kernels.attn_partials`: extend and decode
  differ only in a runtime argument, the number of parts), with constants (BLOCK_M, BLOCK_N,
  KV_SPLIT, the launch options) that depend on the head dim alone; arguments that vary between
  calls are excluded from Triton's specialization, so every call of a model's layer runs the same
  binary;
- a row's keys are summed in blocks of BLOCK_N = 64 and splits of 512 at absolute positions,
  never where a chunk, a cached prefix, a window or a batch begins; a row's state changes only in
  blocks where it sees a key, so the blocks a tile covers for its other rows leave it untouched;
- a tensor-core product computes an output element from its own row and column alone, so the
  other rows of a tile (other tokens, heads, padding) change nothing;
- splits and parts are folded in increasing order by one function (`kernels.merge`), inside the
  partials kernel or in the combine kernel; its arithmetic is element-wise, and FMA contraction is
  off (enable_fp_fusion=False), so it rounds the same in both.
What would break it: launching the kernels with other constants or launch options per call
(e.g. a BLOCK_M chosen by batch size, autotuning), a Triton version whose code generation of the
dot or the row reductions depends on something other than these constants (the compiled kernel
is fixed per build, not across builds), FMA contraction on in one kernel and not the other,
tensors whose strides differ between calls (a q that is sometimes a view and sometimes a copy
compiles a second variant; bits are expected to agree but are not guaranteed), and float32
inputs with TF32 products (the launchers ask for IEEE products in float32). Across GPU models or
builds bits can differ, as with every GPU kernel.

Tested on CPU under Triton's interpreter (tests/model/test_triton_attention.py, TRITON_INTERPRET=1
set by tests/conftest.py) against a float64 softmax and for bit invariance, with the problems of
`checks.py`; `aot.py` compiles the kernels for sm_90 with Triton's bundled ptxas (no GPU), and
scripts/gpu_check.py runs the same checks compiled on a GPU and times them (on an H200, 2026-12-04:
every check passed; docs/gpu.md). `pointwise.py` holds the element-wise kernels (RMSNorm, SiLU *
up, RoPE) the model's ops take on CUDA.
"""
