"""Plain-torch functional reference of Infini-attention's segment pass (Munkhdalai et al. 2024).

This module is the one specification of the op: the fused kernels reproduce it, the "infini"
layer (`attnlens.hooked_models.attention.infini.layer`) and the tests import it; `infini_reference`
is `segment_pass` with the argument order of `attnlens.kernels.infini.infini_attention`. It knows
nothing of hooks or modules: tensors in, tensors out. Layout follows the model (TransformerLens):
per-token tensors are `[batch pos head_index d_head]`, the compressive memory is `M [batch
head_index d_key d_value]` and its normaliser `z [batch head_index d_key]` (d_key = d_value = d_head
here).

Paper equations (arXiv 2404.07143, section 3):

    sigma(x) = ELU(x) + 1                                        (> 0 everywhere)
    A_mem    = sigma(Q) M_{s-1} / (sigma(Q) z_{s-1})                          (Eq. 7)
    linear:  M_s = M_{s-1} + sigma(K)^T V,   z_s = z_{s-1} + sum_t sigma(K_t)  (Eq. 8)
    delta:   M_s = M_{s-1} + sigma(K)^T (V - sigma(K) M_{s-1} / (sigma(K) z_{s-1}))   (Eq. 9)
    A        = sigmoid(beta) A_mem + (1 - sigmoid(beta)) A_dot                 (Eq. 10)

Choices the paper leaves open, made here:
- M_0 = 0, z_0 = 0, and an empty memory reads as 0 (no 0/0): the denominator is clamped to
  the smallest normal float, and the numerator is exactly 0 whenever z is. The delta rule's
  retrieval on an empty memory is therefore 0, so the first update equals the linear one.
- Where the memory is still empty (the first segment) the gate is not applied: A = A_dot. So a
  model whose segment covers the whole input is exactly MHA.
- Memory arithmetic runs in `memory_dtype(model dtype)` (float32, or float64 for float64
  models): M and z are unnormalised sums that grow with the stream and overflow fp16/bf16.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float
from torch import Tensor

UPDATE_RULES = ("linear", "delta")


def masked_softmax(scores: Tensor, allowed: Tensor) -> Tensor:
    """Softmax over the last axis in >= float32; rows with no allowed key give zeros, not NaN."""
    work = scores.float() if scores.dtype in (torch.float16, torch.bfloat16) else scores
    pattern = torch.softmax(work, dim=-1).to(scores.dtype)
    has_key = allowed.any(-1, keepdim=True)
    if bool(has_key.all()):  # the usual case: no fully masked row, nothing to zero
        return pattern
    return pattern.masked_fill(~has_key, 0.0)


def memory_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for half/bfloat16/float32 models, float64 for float64 models."""
    return torch.promote_types(dtype, torch.float32)


def sigma(x: Tensor) -> Tensor:
    """The paper's memory non-linearity, ELU(x) + 1 (strictly positive)."""
    return F.elu(x) + 1


def _safe_div(num: Tensor, den: Tensor) -> Tensor:
    # den >= 0 always (sigma > 0, z >= 0); it is 0 only for an empty memory, where num is 0 too.
    return num / den.clamp_min(torch.finfo(den.dtype).tiny)


def empty_memory(batch: int, n_heads: int, d_key: int, d_value: int, dtype: torch.dtype,
                 device=None) -> tuple[Tensor, Tensor]:
    """`(M_0, z_0)`: zeros `[batch head_index d_key d_value]` and `[batch head_index d_key]`."""
    M = torch.zeros(batch, n_heads, d_key, d_value, dtype=dtype, device=device)
    return M, torch.zeros(batch, n_heads, d_key, dtype=dtype, device=device)


def retrieve(sq: Float[Tensor, "batch pos head_index d_key"],
             M: Float[Tensor, "batch head_index d_key d_value"],
             z: Float[Tensor, "batch head_index d_key"]) -> Float[Tensor, "batch pos head d_value"]:
    """Eq. 7: `sigma(Q) M / (sigma(Q) z)` for already-activated `sq = sigma(Q)`; 0 if M is empty."""
    num = torch.einsum("bnhk,bhkv->bnhv", sq, M)
    den = torch.einsum("bnhk,bhk->bnh", sq, z)[..., None]
    return _safe_div(num, den)


def update(sk: Float[Tensor, "batch pos head_index d_key"],
           v: Float[Tensor, "batch pos head_index d_value"],
           M: Tensor, z: Tensor, rule: str = "linear") -> tuple[Tensor, Tensor]:
    """One segment's memory update; returns `(M_s, z_s)`.

    `sk = sigma(K)` must be zero at padded positions (they then contribute nothing). "linear" is
    Eq. 8; "delta" is Eq. 9, which first subtracts what the memory already returns for each key.
    """
    if rule == "delta":
        v = v - retrieve(sk, M, z)
    return M + torch.einsum("bnhk,bnhv->bhkv", sk, v), z + sk.sum(1)


def memory_nonempty(z: Tensor) -> Bool[Tensor, "batch head_index"]:
    """True where the memory holds something (z is a sum of strictly positive sigma(k))."""
    return (z > 0).any(-1)


def local_attention(qr: Float[Tensor, "batch q head_index d_head"],
                    kr: Float[Tensor, "batch k head_index d_head"],
                    v: Float[Tensor, "batch k head_index d_head"],
                    key_valid: Bool[Tensor, "batch k"] | None, q_offset: int,
                    scale: float) -> Float[Tensor, "batch q head_index d_head"]:
    """A_dot (Eq. 6): causal softmax attention inside one segment.

    The keys are the segment's first `k` tokens; the queries are its tokens
    `q_offset .. q_offset + q - 1` (a streamed piece of the segment), so query i may read keys
    `j <= q_offset + i`. Positional encoding must already be applied to `qr`, `kr`.
    """
    n_q, n_k = qr.shape[1], kr.shape[1]
    scores = torch.einsum("bqhd,bkhd->bhqk", qr, kr) / scale
    q_idx = torch.arange(q_offset, q_offset + n_q, device=qr.device)
    allowed = (torch.arange(n_k, device=qr.device)[None, :] <= q_idx[:, None])[None, None]
    scores = scores.masked_fill(~allowed, float("-inf"))
    if key_valid is None:   # every query may read itself: no empty rows
        pattern = torch.softmax(scores, dim=-1)
    else:
        allowed = allowed & key_valid[:, None, None, :]
        pattern = masked_softmax(scores.masked_fill(~allowed, float("-inf")), allowed)
    return torch.einsum("bhqk,bkhd->bqhd", pattern, v)


def mix(a_mem: Tensor, a_dot: Tensor, gate: Tensor,
        nonempty: Bool[Tensor, "batch head_index"]) -> Tensor:
    """Eq. 10 with the gate switched off where the memory is empty: `[batch pos head d]`.
    `gate` is per head, or per (batch, head) where a hook has edited it."""
    gate = gate if gate.dim() == 2 else gate[None]
    g = gate[:, None, :, None] * nonempty[:, None, :, None]
    return g * a_mem + (1 - g) * a_dot


def segment_pass(qr: Tensor, kr: Tensor, q: Tensor, k: Tensor, v: Tensor,
                 valid: Bool[Tensor, "batch pos"] | None, segment_len: int,
                 gate: Float[Tensor, "head_index"],  # noqa: F821 (jaxtyping axis)
                 rule: str = "linear", scale: float = 1.0,
                 detach_every: int = 0, memory: tuple[Tensor, Tensor] | None = None,
                 ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """The whole-input pass: split into segments of `segment_len`, attend, read, update, repeat.

    Args:
        qr, kr: queries/keys with the local positional encoding applied `[batch pos head d]`.
        q, k: the same without positional encoding (the memory path never sees positions).
        v: values. All five in one (memory) dtype; position `p` belongs to segment `p // N`.
        valid: False at empty slots (padding); None means all valid.
        gate: sigmoid(beta) per head.
        detach_every: 0 keeps the graph through every segment (full BPTT, the paper's choice);
            n > 0 detaches (M, z) after every n-th segment (truncated BPTT).
        memory: `(M, z)` to start from; default empty.

    Returns:
        `(A, (M, z))`: the mixed per-head output `[batch pos head_index d_head]` (Eq. 10) and
        the memory after the last segment (a trailing partial segment included).
    """
    b, T, H, d = q.shape
    M, z = memory if memory is not None else empty_memory(b, H, d, v.shape[-1], q.dtype, q.device)
    outs = []
    for s, start in enumerate(range(0, T, segment_len)):
        sl = slice(start, start + segment_len)
        kv = None if valid is None else valid[:, sl]
        a_dot = local_attention(qr[:, sl], kr[:, sl], v[:, sl], kv, 0, scale)
        a_mem = retrieve(sigma(q[:, sl]), M, z)
        outs.append(mix(a_mem, a_dot, gate, memory_nonempty(z)))
        sk = sigma(k[:, sl])
        if kv is not None:
            sk = sk * kv[:, :, None, None]
        M, z = update(sk, v[:, sl], M, z, rule)
        if detach_every and (s + 1) % detach_every == 0:
            M, z = M.detach(), z.detach()
    return torch.cat(outs, dim=1), (M, z)


def memory_read_weights(sq: Float[Tensor, "batch head_index pos d_key"],
                        sk: Float[Tensor, "batch head_index pos d_key"],
                        v: Float[Tensor, "batch head_index pos d_value"],
                        seg: Tensor, past: Bool[Tensor, "batch query_pos key_pos"],
                        n_segments: int, rule: str = "linear", detach_every: int = 0):
    """The memory read expanded over tokens: `A_mem[i] = sum_j W[i, j] v[j]` exactly.

    M_{s-1} is a sum over past tokens `M = sum_j u_j v_j^T` with one key-side vector `u_j` per
    token. Linear rule (Eq. 8): `u_j = sigma(k_j)`, so `W[i, j] = sigma(q_i).sigma(k_j) /
    sum_j' sigma(q_i).sigma(k_j')`. Delta rule (Eq. 9): the update of segment s subtracts
    `B_s M_{s-1}` with `B_s = sum_{t in s} sigma(k_t) sigma(k_t)^T / (sigma(k_t).z_{s-1})`, so
    every older `u_j` becomes `(I - B_s) u_j`; M stays linear in the values.

    Args:
        sq, sk: sigma(q), sigma(k) (sk zero at padding), head-major.
        seg: segment index of every token `[batch pos]`; past: True where key j lies in an
            earlier segment than query i (and both are real tokens).

    Returns:
        `(W, nonempty, Ms, zs)`: weights `[batch head_index query_pos key_pos]`, whether each
        query's memory is non-empty `[batch head_index query_pos]`, and the memory after each
        segment `[batch segment head_index d_key d_value]`, `[batch segment head_index d_key]`.
    """
    b, H, T, dk = sk.shape
    U, z = sk, sk.new_zeros(b, H, dk)
    W = sq.new_zeros(b, H, T, T)
    nonempty = torch.zeros(b, H, T, dtype=torch.bool, device=sq.device)
    Ms, zs = [], []
    for s in range(n_segments):
        in_s = (seg == s)[:, None, :]
        if s > 0:
            read = _safe_div(torch.einsum("bhqd,bhkd->bhqk", sq, U),
                             torch.einsum("bhqd,bhd->bhq", sq, z)[..., None])
            W = torch.where(in_s[..., None] & past[:, None], read, W)
            nonempty = torch.where(in_s, memory_nonempty(z)[..., None], nonempty)
        ks = sk * in_s[..., None]
        if rule == "delta" and s > 0:
            c = torch.einsum("bhtd,bhd->bht", ks, z)[..., None]
            B = torch.einsum("bhtd,bhte->bhde", _safe_div(ks, c), ks)   # symmetric
            U = torch.where((seg < s)[:, None, :, None], U - U @ B, U)
        z = z + ks.sum(2)
        upto = (seg <= s)[:, None, :, None]
        Ms.append(torch.einsum("bhtd,bhte->bhde", U * upto, v))
        zs.append(z)
        if detach_every and (s + 1) % detach_every == 0:
            U, z = torch.where(upto, U.detach(), U), z.detach()
    return W, nonempty, torch.stack(Ms, 1), torch.stack(zs, 1)


def infini_reference(qr: Float[Tensor, "batch pos head_index d_head"],
                     kr: Float[Tensor, "batch pos head_index d_head"],
                     q: Float[Tensor, "batch pos head_index d_head"],
                     k: Float[Tensor, "batch pos head_index d_head"],
                     v: Float[Tensor, "batch pos head_index d_head"],
                     segment_len: int,
                     gate: Float[Tensor, "head_index"],  # noqa: F821 (jaxtyping axis)
                     rule: str = "linear",
                     scale: float = 1.0, valid: Bool[Tensor, "batch pos"] | None = None,
                     detach_every: int = 0) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """`(A [batch pos head_index d_head], (M, z))` as `segment_pass`.

    `qr`, `kr`: queries / keys with the local positional encoding; `q`, `k` without (the memory
    never sees positions). `scale` divides the local scores (the model's attn_scale); `gate` is
    sigmoid(beta) per head. All tensors in the memory dtype, as the variant calls it.
    """
    return segment_pass(qr, kr, q, k, v, valid, segment_len, gate, rule, scale, detach_every)
