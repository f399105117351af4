"""The gated delta rule (gated DeltaNet): the C++ kernel's entry point, and its torch forms.

On CPU the layers run `gated_delta_rule` of radixkv.model.kernels (deltanet.cpp): every token, in
a prompt, a chunk or a decode step, goes through the recurrence below with one fixed order, so
its output and the state after it do not depend on where a chunk or a cached prefix ended. The
torch forms here are the fallback where the kernels are not built (and the tests' references): a
recurrent form (decode) and a chunked form (prompts), which round differently from each other.

Per value head, with a state S [dk, dv], unit-norm key k_t, scaled query q_t, decay a_t = exp(g_t)
and write strength beta_t, token t does:
    S <- a_t * S
    u_t = beta_t * (v_t - S^T k_t)          (the delta: what S does not yet predict)
    S <- S + k_t u_t^T
    o_t = S^T q_t
The chunked form computes the same thing c tokens at a time with matmuls. Inside a chunk let
G_i = g_1 + ... + g_i (log of the decay since the chunk start) and S0 the state before it. Then
    u = T^-1 (beta V) - T^-1 (beta exp(G) K) S0,
    T = I + strictly_lower(beta_i exp(G_i - G_j) k_i.k_j)
    o_i = exp(G_i) q_i^T S0 + sum_{j <= i} exp(G_i - G_j) (q_i.k_j) u_j
    S_end = exp(G_c) S0 + sum_j exp(G_c - G_j) k_j u_j^T
Only differences G_i - G_j with j <= i and G_i <= 0 are exponentiated, so nothing overflows.
Everything runs in float32; states are float32.
"""

from __future__ import annotations

from typing import Any

import torch


def kernel(x: torch.Tensor) -> Any:
    """The C++ module whose `gated_delta_rule` serves tensors like x, or None (not on CPU, not
    built, or $RADIXKV_DELTANET_KERNEL=0)."""
    if x.device.type != "cpu":
        return None
    from radixkv.model.kernels import deltanet

    return deltanet()


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(sum x^2 + eps) over the last dim (the reference's l2norm)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def prepare_qk(
    q: torch.Tensor, k: torch.Tensor, num_v_heads: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., Hk, dk] → float32 [..., Hv, dk]: key heads shared by consecutive value heads,
    L2-normalised, queries scaled by dk^-0.5."""
    rep = num_v_heads // q.shape[-2]
    if rep > 1:
        q = q.repeat_interleave(rep, dim=-2)
        k = k.repeat_interleave(rep, dim=-2)
    q = l2_normalize(q.float())
    k = l2_normalize(k.float())
    return q * q.shape[-1] ** -0.5, k


def recurrent_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token for each of R sequences: q, k [R, H, dk] (prepared), v [R, H, dv], g, beta
    [R, H] float32, state [R, H, dk, dv] float32 → (o [R, H, dv], new state)."""
    s = state * g.exp()[..., None, None]
    pred = torch.einsum("rhkv,rhk->rhv", s, k)
    u = (v.float() - pred) * beta[..., None]
    s = s + k[..., :, None] * u[..., None, :]
    return torch.einsum("rhkv,rhk->rhv", s, q), s


def chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    chunk: int = 64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence of t tokens: q, k [t, H, dk] (prepared), v [t, H, dv], g, beta [t, H]
    float32, state [H, dk, dv] float32 (before the first token) → (o [t, H, dv], state after)."""
    t = q.shape[0]
    # Heads first: [H, t, d].
    qh, kh = q.transpose(0, 1), k.transpose(0, 1)
    vh = v.float().transpose(0, 1)
    gh, bh = g.transpose(0, 1), beta.transpose(0, 1)
    out = torch.empty_like(vh)
    s = state.float()
    for a in range(0, t, chunk):
        b = min(a + chunk, t)
        o, s = _chunk(qh[:, a:b], kh[:, a:b], vh[:, a:b], gh[:, a:b], bh[:, a:b], s)
        out[:, a:b] = o
    return out.transpose(0, 1), s


def _chunk(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    s0: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk, heads batched: q, k [H, c, dk], v [H, c, dv], g, beta [H, c], s0 [H, dk, dv]."""
    c = q.shape[1]
    cum = g.cumsum(-1)  # G_i
    diff = cum[:, :, None] - cum[:, None, :]  # G_i - G_j
    lower = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
    decay = torch.where(lower, diff, torch.full_like(diff, float("-inf"))).exp()  # j <= i
    kb = k * beta[..., None]
    strict = (kb @ k.transpose(-1, -2)) * decay.tril(-1)
    eye = torch.eye(c, dtype=q.dtype, device=q.device)
    tri = eye + strict
    rhs = torch.cat([v * beta[..., None], kb * cum.exp()[..., None]], dim=-1)
    sol = torch.linalg.solve_triangular(tri, rhs, upper=False, unitriangular=True)
    dv = v.shape[-1]
    u = sol[..., :dv] - sol[..., dv:] @ s0
    o = (q * cum.exp()[..., None]) @ s0 + ((q @ k.transpose(-1, -2)) * decay) @ u
    last = cum[:, -1:]  # G_c
    s_end = s0 * last.exp()[..., None] + (k * (last - cum).exp()[..., None]).transpose(-1, -2) @ u
    return o, s_end
