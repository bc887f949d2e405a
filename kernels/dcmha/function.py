"""`dcmha_attention(q, k, v, pre, post, ...) -> (out, lse)`: the fused DCMHA maps as a
differentiable op.

Forward: the two tensor-core passes of `triton_fwd_tc` (64-row tiles, heads streamed, Compose
through its low-rank channels) when every phase has at most `triton_fwd_tc.MAX_CHANNELS`
query-wise channels (the official Compose has 2), else the two all-heads passes of
`triton_fwd`; both give the same lse. Backward: the two tensor-core recompute passes of
`triton_bwd_tc` (delta, then everything else with atomics) under the same rule (a given static
B counts H channels there even when it equals I, for its gradient), else the two all-heads
passes of `triton_bwd`. None keeps a `[query, key]` map in memory (saved:
q, k, v, the compose weights in the kernel layout, O(T), and the row lse).

`recompute_backward` is the plain-torch counterpart of the backward: the spec re-run query
chunk by query chunk under torch autograd (query rows are independent given q, k, v and the
weights, so the sum over chunks is the full gradient, with O(chunk * key_pos * head_index)
memory). It is the backward's second oracle in the tests and a fallback to read.

Example (on CUDA, or on CPU with TRITON_INTERPRET=1 set before import):
    >>> out, lse = dcmha_attention(q, k, v, pre, post, window=None)   # doctest: +SKIP
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

from attnlens.kernels._triton import kernel_dtype, kernel_key_valid
from attnlens.kernels.dcmha.reference import (
    ComposeWeights,
    check_compose_weights,
    dcmha_attention_reference,
)
from attnlens.kernels.dcmha.triton_bwd import dcmha_bwd
from attnlens.kernels.dcmha.triton_bwd_tc import dcmha_tc_bwd, grad_channels, kernel_layout_grads
from attnlens.kernels.dcmha.triton_fwd import dcmha_fwd
from attnlens.kernels.dcmha.triton_fwd_tc import MAX_CHANNELS, channel_weights, dcmha_tc_fwd
from attnlens.kernels.flash_attention.function import check_inputs

N_WEIGHTS = 7          # tensors of one ComposeWeights: qw1 qw2 qdd kw1 kw2 kdd static
CHUNK_ELEMENTS = 1 << 22   # recompute-backward budget: chunk * key_pos * head_index per map
# Which rows each of (q, k, v, *pre, *post) is indexed by: query, key, or none (static B).
SIDES = ("q", "k", "k") + ("q", "q", "q", "k", "k", "k", "-") * 2


def kernel_weights(w: ComposeWeights, n_heads: int, device) -> tuple[Tensor | None, ...]:
    """`(B [H H], w1q, w2q [b t C H], ddq [b t H], w1k, w2k, ddk)` fp32 contiguous, the layout
    of `triton_fwd`: group factors laid out over all H heads (zero outside the group), C = G R."""
    G, R, M = w.qw1.shape[2:]
    f32 = dict(device=device, dtype=torch.float32)
    eye_g = torch.eye(G, **f32)

    def factor(t: Tensor | None) -> Tensor | None:
        if t is None:
            return None
        full = torch.einsum("btgrm,gj->btgrjm", t.detach().to(**f32), eye_g)
        return full.reshape(t.shape[0], t.shape[1], G * R, n_heads).contiguous()

    def gate(t: Tensor | None) -> Tensor | None:
        return None if t is None else t.detach().to(**f32).reshape(*t.shape[:2], -1).contiguous()

    static = (torch.eye(n_heads, **f32) if w.static is None
              else torch.block_diag(*w.static.detach().to(**f32).unbind(0)).contiguous())
    return (static, factor(w.qw1), factor(w.qw2), gate(w.qdd), factor(w.kw1), factor(w.kw2),
            gate(w.kdd))


def recompute_backward(dout: Tensor, dlse: Tensor | None, q: Tensor, k: Tensor, v: Tensor,
                       pre: ComposeWeights, post: ComposeWeights, scale: float,
                       window: int | None, key_valid: Tensor | None,
                       chunk: int | None = None) -> tuple[Tensor | None, ...]:
    """Gradients `(dq, dk, dv, *pre tensors, *post tensors)` (None for absent weights) of
    `<dout, out> + <dlse, lse>`, from float32 recomputation of the spec over query chunks."""
    B, T_Q, H, _ = q.shape
    T_K = k.shape[1]
    offset = T_K - T_Q
    if chunk is None:
        chunk = max(16, CHUNK_ELEMENTS // max(1, T_K * H))
    work = torch.float32 if q.dtype != torch.float64 else torch.float64
    leaves = [q, k, v, *pre.tensors(), *post.tensors()]
    grads = [None if t is None else torch.zeros(t.shape, dtype=work, device=t.device)
             for t in leaves]
    dout = dout.to(work)
    for i0 in range(0, T_Q, chunk):
        i1 = min(T_Q, i0 + chunk)
        k_end = offset + i1                         # causal: no later key is seen
        k_lo = 0 if window is None else max(0, offset + i0 - window)

        q_rows, k_rows = slice(i0, i1), slice(k_lo, k_end)

        def rows(t: Tensor | None, side: str, q_rows=q_rows, k_rows=k_rows) -> Tensor | None:
            return None if t is None else t[:, q_rows if side == "q" else k_rows]

        parts = [rows(q, "q"), rows(k, "k"), rows(v, "k")]
        for w in (pre, post):
            parts += [rows(w.qw1, "q"), rows(w.qw2, "q"), rows(w.qdd, "q"),
                      rows(w.kw1, "k"), rows(w.kw2, "k"), rows(w.kdd, "k"), w.static]
        inputs = [None if t is None else t.detach().to(work).requires_grad_() for t in parts]
        with torch.enable_grad():
            pre_c = ComposeWeights(*inputs[3:3 + N_WEIGHTS])
            post_c = ComposeWeights(*inputs[3 + N_WEIGHTS:])
            kv = None if key_valid is None else key_valid[:, k_lo:k_end]
            # Keys from k_lo: the spec aligns the chunk's queries to its last key, which is
            # key k_end - 1; the window (if any) hides every key before k_lo anyway.
            out_c, lse_c = dcmha_attention_reference(inputs[0], inputs[1], inputs[2], pre_c,
                                                     post_c, scale, window, kv)
            outs, douts = [out_c], [dout[:, i0:i1]]
            if dlse is not None:
                outs.append(lse_c)
                douts.append(dlse[:, :, i0:i1].to(work))
            used = [t for t in inputs if t is not None]
            got = iter(torch.autograd.grad(outs, used, douts, allow_unused=True))
        for j, t in enumerate(inputs):
            if t is None:
                continue
            g = next(got)
            if g is None:
                continue
            if SIDES[j] == "q":
                grads[j][:, i0:i1] += g
            elif SIDES[j] == "k":
                grads[j][:, k_lo:k_end] += g
            else:                                                     # static B
                grads[j] += g
    return tuple(None if g is None else g.to(t.dtype) for g, t in zip(grads, leaves, strict=True))


def _from_kernel_layout(grads: tuple, like: ComposeWeights) -> tuple[Tensor | None, ...]:
    """Gradients of the `kernel_weights` layout -> those of `like`'s tensors (same order)."""
    G, R, M = like.qw1.shape[2:]
    dB, *rest = grads

    def factor(g: Tensor | None, t: Tensor | None) -> Tensor | None:
        if t is None:
            return None
        blocks = g.view(*g.shape[:2], G, R, G, M).diagonal(dim1=2, dim2=4)   # b t R M G
        return blocks.permute(0, 1, 4, 2, 3).to(t.dtype)

    def gate(g: Tensor | None, t: Tensor | None) -> Tensor | None:
        return None if t is None else g.view(t.shape).to(t.dtype)

    out = [factor(rest[0], like.qw1), factor(rest[1], like.qw2), gate(rest[2], like.qdd),
           factor(rest[3], like.kw1), factor(rest[4], like.kw2), gate(rest[5], like.kdd)]
    static = None
    if like.static is not None:
        static = dB.view(G, M, G, M).diagonal(dim1=0, dim2=2).permute(2, 0, 1)
        static = static.to(like.static.dtype)
    return (*out, static)


def fused_backward(dout, q, k, v, lse, dlse, kpre: tuple, kpost: tuple, statics: tuple,
                   scale: float, window: int | None, key_valid, block_m: int | None,
                   block_n: int | None) -> tuple:
    """`(dq, dk, dv, pre_grads, post_grads)` fp32, weight gradients in the `kernel_weights`
    layout: from the tensor-core backward (`triton_bwd_tc`) when every phase has at most
    MAX_CHANNELS query-wise channels once a given static B counts H more (`statics`: whether
    pre / post have one), else from the all-heads-per-tile backward (`triton_bwd`)."""
    H = q.shape[2]
    chans = [grad_channels(w, H, s) for w, s in zip((kpre, kpost), statics, strict=True)]
    if max(c[0].shape[2] for c in chans) > MAX_CHANNELS:
        return dcmha_bwd(dout, q, k, v, lse, dlse, kpre, kpost, scale, window, key_valid,
                         block_m, block_n)
    dq, dk, dv, g_pre, g_post = dcmha_tc_bwd(dout, q, k, v, lse, dlse, *chans, scale, window,
                                             key_valid, block_m, block_n)
    C = kpre[1].shape[2]
    return (dq, dk, dv, kernel_layout_grads(g_pre, C, H, statics[0]),
            kernel_layout_grads(g_post, C, H, statics[1]))


def fused_forward(q, k, v, kpre: tuple, kpost: tuple, scale: float, window: int | None,
                  key_valid, block_m: int | None, block_n: int | None) -> tuple[Tensor, Tensor]:
    """`(out, lse)` from the tensor-core forward (`triton_fwd_tc`) when every phase has at
    most MAX_CHANNELS query-wise channels (rank * groups, plus H for a static B other than I;
    the official Compose has 2), else from the all-heads-per-tile forward (`triton_fwd`)."""
    H = q.shape[2]
    cpre, cpost = channel_weights(kpre, H), channel_weights(kpost, H)
    if max(cpre[0].shape[2], cpost[0].shape[2]) <= MAX_CHANNELS:
        return dcmha_tc_fwd(q, k, v, cpre, cpost, scale, window, key_valid, block_m, block_n)
    return dcmha_fwd(q, k, v, kpre, kpost, scale, window, key_valid, block_m, block_n)


class DCMHAFunction(torch.autograd.Function):
    """autograd.Function over `fused_forward` / `fused_backward` (two Triton passes each);
    saves q, k, v, the compose weights (O(T)) and the row lse, no `[query, key]` map."""

    @staticmethod
    def forward(ctx, q, k, v, scale, window, key_valid, block_m, block_n, *weights):
        H = q.shape[2]
        pre = ComposeWeights(*weights[:N_WEIGHTS])
        post = ComposeWeights(*weights[N_WEIGHTS:])
        work = kernel_dtype(q.dtype)
        kv = kernel_key_valid(key_valid, q.device)
        q_, k_, v_ = q.to(work), k.to(work), v.to(work)
        kpre, kpost = kernel_weights(pre, H, q.device), kernel_weights(post, H, q.device)
        out, lse = fused_forward(q_, k_, v_, kpre, kpost, scale, window, kv, block_m, block_n)
        ctx.save_for_backward(q_, k_, v_, lse, *(t for t in kpre + kpost if t is not None))
        ctx.present = [t is not None for t in kpre + kpost]
        ctx.like = (pre.map(lambda t: torch.empty(t.shape, dtype=t.dtype, device="meta")),
                    post.map(lambda t: torch.empty(t.shape, dtype=t.dtype, device="meta")))
        ctx.config = (q.dtype, scale, window, kv, block_m, block_n)
        return out.to(q.dtype), lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, lse, *present = ctx.saved_tensors
        it = iter(present)
        kw = [next(it) if p else None for p in ctx.present]
        dtype, scale, window, kv, block_m, block_n = ctx.config
        if dout is None:
            dout = torch.zeros_like(q)
        like_pre, like_post = ctx.like
        statics = (like_pre.static is not None, like_post.static is not None)
        dq, dk, dv, g_pre, g_post = fused_backward(
            dout.to(q.dtype), q, k, v, lse, dlse, tuple(kw[:N_WEIGHTS]), tuple(kw[N_WEIGHTS:]),
            statics, scale, window, kv, block_m, block_n)
        return (dq.to(dtype), dk.to(dtype), dv.to(dtype), None, None, None, None, None,
                *_from_kernel_layout(g_pre, like_pre), *_from_kernel_layout(g_post, like_post))


def dcmha_attention(q: Float[Tensor, "batch query_pos head_index d_head"],
                    k: Float[Tensor, "batch key_pos head_index d_head"],
                    v: Float[Tensor, "batch key_pos head_index d_head"],
                    pre: ComposeWeights, post: ComposeWeights, scale: float | None = None,
                    window: int | None = None, key_valid: Tensor | None = None,
                    block_m: int | None = None, block_n: int | None = None
                    ) -> tuple[Tensor, Tensor]:
    """Fused causal DCMHA maps; returns `(out [batch query_pos head_index d_head], lse [batch
    head_index query_pos] float32)`, differentiable in q, k, v and every compose weight.

    Semantics are `reference.dcmha_attention_reference`; `scale` multiplies q.k (default
    d_head ** -0.5); `window` limits keys to q_pos - k_pos <= window; `key_valid [batch
    key_pos]` masks padding. Both phases must be query-wise only or both key-wise.
    """
    check_inputs(q, k, v, key_valid, causal=True)
    B, T_Q, H, _ = q.shape
    for phase, w in (("pre", pre), ("post", post)):
        check_compose_weights(w, phase, B, T_Q, k.shape[1], H)
    if pre.key_wise != post.key_wise or pre.qw1.shape != post.qw1.shape:
        raise ValueError("pre and post must share rank, groups and key-wise terms, got "
                         f"{tuple(pre.qw1.shape)} key_wise={pre.key_wise} and "
                         f"{tuple(post.qw1.shape)} key_wise={post.key_wise}")
    if window is not None and (not isinstance(window, int) or window < 0):
        raise ValueError(f"window must be a non-negative int or None, got {window!r}")
    if scale is None:
        scale = q.shape[-1] ** -0.5
    return DCMHAFunction.apply(q, k, v, float(scale), window, key_valid, block_m, block_n,
                               *pre.tensors(), *post.tensors())


__all__ = ["DCMHAFunction", "dcmha_attention", "fused_backward", "fused_forward",
           "kernel_weights", "recompute_backward"]
