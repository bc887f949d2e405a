"""`cope_attention(q, k, v, pos_emb) -> (out, lse)`: the fused CoPE kernels as a differentiable op.

Example (on CUDA, or on CPU with TRITON_INTERPRET=1 set before import):
    >>> q = k = v = torch.randn(1, 33, 2, 16, requires_grad=True)
    >>> E = torch.zeros(16, 34, requires_grad=True)
    >>> out, lse = cope_attention(q, k, v, E)                       # doctest: +SKIP
    >>> R = torch.randn(16, 33)                                      # CoPE+rel, value gates
    >>> out, lse = cope_attention(q, k, v, E, gate_k=v, rel_emb=R)   # doctest: +SKIP
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

from attnlens.kernels._triton import kernel_dtype, kernel_key_valid
from attnlens.kernels.cope.reference import DEFAULT_SCALING, SCALINGS
from attnlens.kernels.cope.triton_bwd import cope_bwd
from attnlens.kernels.cope.triton_fwd import cope_fwd
from attnlens.kernels.flash_attention.function import check_inputs


class CoPEFunction(torch.autograd.Function):
    """autograd.Function over `cope_fwd`/`cope_bwd`; saves the inputs, out and lse (no [T, T])."""

    @staticmethod
    def forward(ctx, q, k, v, pos_emb, gate_k, rel_emb, q_positions, k_positions, scale,
                e_scale, rel_extend, key_valid, block_m, block_n):
        extra = dict(gate_k=gate_k, rel_emb=rel_emb, q_positions=q_positions,
                     k_positions=k_positions, rel_extend=rel_extend)
        out, lse = cope_fwd(q, k, v, pos_emb, scale, e_scale, key_valid, block_m, block_n,
                            **extra)
        ctx.save_for_backward(q, k, v, pos_emb, gate_k, rel_emb, out, lse)
        ctx.positions = (q_positions, k_positions)
        ctx.key_valid = key_valid
        ctx.config = (scale, e_scale, rel_extend, block_m, block_n)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, pos_emb, gate_k, rel_emb, out, lse = ctx.saved_tensors
        scale, e_scale, rel_extend, block_m, block_n = ctx.config
        q_positions, k_positions = ctx.positions
        if dout is None:
            dout = torch.zeros_like(out)
        dq, dk, dv, dE, dgk, dR = cope_bwd(
            dout, q, k, v, pos_emb, out, lse, scale, e_scale, ctx.key_valid, dlse, block_m,
            block_n, gate_k=gate_k, rel_emb=rel_emb, q_positions=q_positions,
            k_positions=k_positions, rel_extend=rel_extend)
        return dq, dk, dv, dE, dgk, dR, None, None, None, None, None, None, None, None


def _check_table(name: str, table: Tensor | None, d_head: int) -> None:
    if table is not None and (table.ndim != 2 or table.shape[0] != d_head or table.shape[1] < 1):
        raise ValueError(f"{name} must be [d_head={d_head}, n >= 1], got {tuple(table.shape)}")


def _check_positions(q: Tensor, k: Tensor, q_positions, k_positions) -> tuple[Tensor, Tensor]:
    """Default positions (queries aligned to the last keys) or the given ones, validated."""
    B, T_Q, T_K = q.shape[0], q.shape[1], k.shape[1]
    if q_positions is None and k_positions is None:
        k_positions = torch.arange(T_K, device=q.device).expand(B, T_K)
        return k_positions[:, T_K - T_Q:], k_positions
    if q_positions is None or k_positions is None:
        raise ValueError("pass both q_positions and k_positions, or neither")
    if tuple(q_positions.shape) != (B, T_Q) or tuple(k_positions.shape) != (B, T_K):
        raise ValueError(f"q_positions / k_positions must be [batch={B}, {T_Q}] / [{B}, {T_K}], "
                         f"got {tuple(q_positions.shape)} / {tuple(k_positions.shape)}")
    if q_positions.is_floating_point() or k_positions.is_floating_point():
        raise ValueError("q_positions / k_positions must be integer tensors")
    return q_positions, k_positions


def cope_attention(q: Float[Tensor, "batch query_pos head_index d_head"],
                   k: Float[Tensor, "batch key_pos head_index d_head"],
                   v: Float[Tensor, "batch key_pos head_index d_head"],
                   pos_emb: Float[Tensor, "d_head npos"] | None, scale: float | None = None,
                   scaling: str = DEFAULT_SCALING, key_valid: Tensor | None = None,
                   block_m: int | None = None, block_n: int | None = None, *,
                   gate_k: Float[Tensor, "batch key_pos head_index d_head"] | None = None,
                   rel_emb: Float[Tensor, "d_head rel_npos"] | None = None,
                   q_positions: Tensor | None = None, k_positions: Tensor | None = None,
                   rel_extend: bool = False) -> tuple[Tensor, Tensor]:
    """Fused causal CoPE attention; returns `(out [batch query_pos head_index d_head],
    lse [batch head_index query_pos] float32)`, differentiable in q, k, v, pos_emb, gate_k and
    rel_emb.

    Semantics are `reference.cope_attention_reference` (`reference.cope_reference`): `scale`
    multiplies the content scores (default d_head ** -0.5); `scaling` "repo" (default, official)
    scales q.e[p] by `scale` too, "paper" adds it as is. Options (the official flags):
    `gate_k` keys of the gates (sep-keys: the gate projection; val-gates: pass v), default k;
    `pos_emb` None: no CoPE term; `rel_emb` r adds `scale * q_i.r[pos_i - pos_j]` for distances
    in [0, rel_npos) (`rel_extend`: longer distances read r[rel_npos - 1]), with integer
    positions `q_positions [batch query_pos]`, `k_positions [batch key_pos]` (default: indices,
    queries aligned to the last keys).
    """
    check_inputs(q, k, v, key_valid, causal=True)
    if scaling not in SCALINGS:
        raise ValueError(f"scaling={scaling!r}; choose one of {list(SCALINGS)}")
    d = q.shape[-1]
    _check_table("pos_emb", pos_emb, d)
    _check_table("rel_emb", rel_emb, d)
    if gate_k is not None and gate_k.shape != k.shape:
        raise ValueError(f"gate_k must have k's shape {tuple(k.shape)}, got "
                         f"{tuple(gate_k.shape)}")
    if rel_extend and rel_emb is None:
        raise ValueError("rel_extend=True extends relative positions: it needs rel_emb")
    if rel_emb is not None:
        q_positions, k_positions = _check_positions(q, k, q_positions, k_positions)
    if scale is None:
        scale = d ** -0.5
    dtype = q.dtype
    work = kernel_dtype(dtype)
    key_valid = kernel_key_valid(key_valid, q.device)
    e_scale = float(scale) if scaling == "repo" else 1.0
    cast = lambda t: None if t is None else t.to(work)  # noqa: E731
    out, lse = CoPEFunction.apply(cast(q), cast(k), cast(v), cast(pos_emb), cast(gate_k),
                                  cast(rel_emb), q_positions, k_positions, float(scale),
                                  e_scale, bool(rel_extend), key_valid, block_m, block_n)
    return out.to(dtype), lse


__all__ = ["SCALINGS", "CoPEFunction", "cope_attention"]
