"""Fused CoPE attention, forward: gates, contextual positions and interpolation in-kernel.

One program owns BLOCK_M query rows of one (batch, head). It first computes the position table
`Z = e_scale * q E` `[BLOCK_M, NPOS]` once (E is shared by the heads), then visits the key tiles
**from the diagonal leftwards**, carrying `c_i`, the sum of the gates of the keys already visited
(to the right). Per tile: `g = sigmoid(s)` (0 where not allowed), `p = c + reverse_cumsum(g)`,
`c += sum(g)`, `p = min(p, npos - 1)`, `logit = s + Z[floor p] + w (Z[floor p + 1] - Z[floor p])`
by `tl.gather` on the register table, then the online softmax (the order of the key tiles does
not matter to it). No `[query, key]` tensor is written; the row log-sum-exp is.

The official options run in the same loop (constexpr flags, so a plain call pays nothing):
separate gate keys (sep-keys; val-gates passes v) replace `s` inside the sigmoid only; CoPE+rel
adds `ZR[i, pos_i - pos_j]` from a second register table `ZR = scale * q R` with a zero column
for distances outside [0, rel_npos) (rel_extend clamps distances to rel_npos - 1 first); a layer
without CoPE but with relative logits runs with the CoPE term off.

The tables live in registers, so `npos` and `rel_npos` are bounded (`MAX_NPOS` on GPU); longer
tables take the materialising path. Layouts as in `attnlens.kernels.flash_attention.triton_fwd`.
"""

from __future__ import annotations

import math

import torch

from attnlens.kernels._head_tiles import d_chunk, dot_rows
from attnlens.kernels._prologue import head_tile, load_tile, softmax_state
from attnlens.kernels._triton import next_pow2, on_gpu, tl, triton
from attnlens.kernels.flash_attention.triton_fwd import _dot

# Largest position table a program keeps in registers on a GPU ([BLOCK_M, NPOS] fp32).
MAX_NPOS = 256

# GPU tiles and launch options of the CoPE kernels: rows `(fp32, max BLOCK_D, BLOCK_M, BLOCK_N,
# options)`; `default_blocks` takes the first row for the dtype with BLOCK_D <= max BLOCK_D.
# fp16/bf16: 16 x 32, 8 warps, maxnreg 255 at every head size and option (without maxnreg
# ptxas caps 8 warps at 128 registers). 4 warps spilled 8 B (fwd) / 24 B (bwd) at d 128 on
# sm_90, and at d 64 on sm_90 8 B with sep-keys and rel(extend) (fwd) and 16 B with npos 256
# (bwd). fp32 (IEEE dots): 16 x 16, 8 warps, 1 stage, maxnreg 255, and every product over or
# along d_head in chunks of 16 read from memory (`chunking`: no q / dO / dQ register tiles;
# chunk loops bounded by the runtime D so that ptxas does not unroll them): 106-214 registers,
# spill-free for every option at d 64 / 128 on sm_80 / sm_90 (before: 184 B in the main
# backward at d 128 on sm_80, up to 3 KB with CoPE+rel or npos 256). 3 stages spilled 168 B
# (fwd, sm_80) / 24 B (bwd, sm_90) at d 128, 4 warps 32 B-1.3 KB, BLOCK_M 32 1.1-1.3 KB (all
# before chunking); compile_check, docs/benchmarks.md.
GPU_LAUNCH = [
    (False, 256, 16, 32, dict(num_warps=8, maxnreg=255)),
    (True, 256, 16, 16, dict(num_warps=8, num_stages=1, maxnreg=255)),
]


@triton.jit
def _pos_table(q, E, e_scale, offs_d, d_valid, NPOS, NPOS_BLOCK: tl.constexpr,
               IEEE: tl.constexpr):
    """Z = e_scale * q @ E `[BLOCK_M, NPOS_BLOCK]` (fp32); E is `[d_head, NPOS]` contiguous."""
    offs_p = tl.arange(0, NPOS_BLOCK)
    e = tl.load(E + offs_d[:, None] * NPOS + offs_p[None, :],
                mask=d_valid[:, None] & (offs_p < NPOS)[None, :], other=0.0)
    return _dot(q, e.to(q.dtype), IEEE) * e_scale


@triton.jit
def _pos_table_chunked(Q, q_rows, m_valid, sq_d, E, e_scale, D, NPOS,
                       NPOS_BLOCK: tl.constexpr, IEEE: tl.constexpr, BLOCK_D: tl.constexpr,
                       DCH: tl.constexpr):
    """`_pos_table` summed over d_head in DCH chunks of q loaded from Q (`q_rows`: element
    offsets of the query rows): `E[d, n]` sits at `d * NPOS + n`."""
    offs_p = tl.arange(0, NPOS_BLOCK)
    return dot_rows(Q, q_rows, m_valid, sq_d, E, offs_p, offs_p < NPOS, NPOS, D, IEEE,
                    BLOCK_D, DCH) * e_scale


@triton.jit
def _cope_tile(q, Z, ZR, c_i, Q, q_rows, m_valid, sq_d, K, GK, kv_ptr, kpos_ptr, k_base,
               g_base, sk_t, sk_d, sg_t, sg_d, qpos, offs_m, offs_d, d_valid, start_n, T_K,
               Q_OFFSET, D, scale, P_MAX, NPOS, RNPOS, HAS_KVALID: tl.constexpr,
               HAS_COPE: tl.constexpr, HAS_GK: tl.constexpr, HAS_REL: tl.constexpr,
               REL_EXTEND: tl.constexpr, BLOCK_N: tl.constexpr, IEEE: tl.constexpr,
               CHUNKED: tl.constexpr, BLOCK_D: tl.constexpr, DCH: tl.constexpr):
    """One key tile's logits; shared verbatim by forward and backward (bitwise-equal p).

    Returns `(logit, s, g, w, lo, hi, keep, c_i, ridx)`: total logits (-inf where not allowed),
    content scores, gates, interpolation weight, floor / ceil indices, the allowed mask, the
    updated gate carry and the relative-table column of every pair (RNPOS: the zero column).
    Without CoPE (HAS_COPE False) g, w, lo, hi are placeholders; without HAS_REL so is ridx.
    CHUNKED (fp32): the scores are summed over d_head in DCH chunks of q read from Q
    (`q_rows`: element offsets of the query rows) instead of one dot on the register tile q.
    """
    offs_n = start_n + tl.arange(0, BLOCK_N)
    n_valid = offs_n < T_K
    if CHUNKED:
        s = dot_rows(Q, q_rows, m_valid, sq_d, K, k_base + offs_n * sk_t, n_valid, sk_d, D,
                     IEEE, BLOCK_D, DCH) * scale
    else:
        kt = tl.load(K + k_base + offs_n[None, :] * sk_t + offs_d[:, None] * sk_d,
                     mask=n_valid[None, :] & d_valid[:, None], other=0.0)
        s = _dot(q, kt, IEEE) * scale
    keep = n_valid[None, :] & (offs_n[None, :] <= offs_m[:, None] + Q_OFFSET)
    if HAS_KVALID:
        kv = tl.load(kv_ptr + offs_n, mask=n_valid, other=0)
        keep = keep & (kv[None, :] != 0)
    logit = s
    g = s
    w = s
    lo = keep.to(tl.int32)
    hi = lo
    if HAS_COPE:
        if HAS_GK:      # sep-keys / val-gates: gates from q . k_gate (eq. 3 with other keys)
            if CHUNKED:
                sg = dot_rows(Q, q_rows, m_valid, sq_d, GK, g_base + offs_n * sg_t, n_valid,
                              sg_d, D, IEEE, BLOCK_D, DCH)
            else:
                gt = tl.load(GK + g_base + offs_n[None, :] * sg_t + offs_d[:, None] * sg_d,
                             mask=n_valid[None, :] & d_valid[:, None], other=0.0)
                sg = _dot(q, gt, IEEE)
            g = tl.where(keep, tl.sigmoid(sg * scale), 0.0)
        else:
            g = tl.where(keep, tl.sigmoid(s), 0.0)                       # eq. 3
        p = c_i[:, None] + tl.cumsum(g, axis=1, reverse=True)            # eq. 4
        c_i = c_i + tl.sum(g, 1)
        p = tl.minimum(p, P_MAX)
        lo = p.to(tl.int32)                                              # floor: p >= 0
        w = p - lo.to(tl.float32)
        hi = tl.minimum(lo + 1, NPOS - 1)
        z_lo = tl.gather(Z, lo, 1)
        z_hi = tl.gather(Z, hi, 1)
        logit = logit + z_lo + w * (z_hi - z_lo)                         # eq. 7
    ridx = lo
    if HAS_REL:         # CoPE+rel: q_i . r[pos_i - pos_j] from the register table ZR
        kpos = tl.load(kpos_ptr + offs_n, mask=n_valid, other=0)
        dist = qpos[:, None] - kpos[None, :]
        if REL_EXTEND:
            dist = tl.minimum(dist, RNPOS - 1)
        ridx = tl.where((dist >= 0) & (dist < RNPOS), dist, RNPOS)
        logit = logit + tl.gather(ZR, ridx, 1)
    logit = tl.where(keep, logit, float("-inf"))
    return logit, s, g, w, lo, hi, keep, c_i, ridx


@triton.jit
def _tile_bounds(pid_m, T_K, Q_OFFSET, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """(last tile start, number of key tiles) for query tile `pid_m`, causal."""
    hi = tl.minimum(T_K, Q_OFFSET + (pid_m + 1) * BLOCK_M)
    last = ((hi - 1) // BLOCK_N) * BLOCK_N
    return last, last // BLOCK_N + 1


@triton.jit
def _tables(q, Q, q_rows, m_valid, sq_d, E, R, e_scale, scale, offs_d, d_valid, D, NPOS, RNPOS,
            HAS_COPE: tl.constexpr, HAS_REL: tl.constexpr, NPOS_BLOCK: tl.constexpr,
            RNPOS_BLOCK: tl.constexpr, IEEE: tl.constexpr, CHUNKED: tl.constexpr,
            BLOCK_D: tl.constexpr, DCH: tl.constexpr):
    """The register tables `(Z, ZR)` of one query tile (each a `[BLOCK_M, 1]` dummy if unused);
    CHUNKED: summed over d_head in DCH chunks of q read from Q (`q` is then a placeholder)."""
    Z = tl.zeros([q_rows.shape[0], 1], dtype=tl.float32)
    ZR = Z
    if HAS_COPE:
        if CHUNKED:
            Z = _pos_table_chunked(Q, q_rows, m_valid, sq_d, E, e_scale, D, NPOS, NPOS_BLOCK,
                                   IEEE, BLOCK_D, DCH)
        else:
            Z = _pos_table(q, E, e_scale, offs_d, d_valid, NPOS, NPOS_BLOCK, IEEE)
    if HAS_REL:     # column RNPOS (and beyond) is 0: distances outside [0, RNPOS) add nothing
        if CHUNKED:
            ZR = _pos_table_chunked(Q, q_rows, m_valid, sq_d, R, scale, D, RNPOS, RNPOS_BLOCK,
                                    IEEE, BLOCK_D, DCH)
        else:
            ZR = _pos_table(q, R, scale, offs_d, d_valid, RNPOS, RNPOS_BLOCK, IEEE)
    return Z, ZR


@triton.jit
def cope_fwd_kernel(Q, K, V, E, GK, R, QPOS, KPOS, O, LSE, KVALID,
                    sq_b, sq_t, sq_h, sq_d, sk_b, sk_t, sk_h, sk_d,
                    sv_b, sv_t, sv_h, sv_d, sg_b, sg_t, sg_h, sg_d, so_b, so_t, so_h, so_d,
                    skv_b, H, T_Q, T_K, Q_OFFSET, D, NPOS, RNPOS, scale, e_scale, P_MAX,
                    HAS_KVALID: tl.constexpr, HAS_COPE: tl.constexpr, HAS_GK: tl.constexpr,
                    HAS_REL: tl.constexpr, REL_EXTEND: tl.constexpr, IEEE: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                    NPOS_BLOCK: tl.constexpr, RNPOS_BLOCK: tl.constexpr,
                    CHUNKED: tl.constexpr, DCH: tl.constexpr):
    """Grid `(cdiv(T_Q, BLOCK_M), batch * H)`. CHUNKED (fp32): products over d_head in DCH
    chunks read from memory, no q tile in registers (`chunking`)."""
    pid_m, pid_bh, b, h, offs_m, offs_d, m_valid, d_valid, md_mask = head_tile(
        T_Q, H, D, BLOCK_M, BLOCK_D)
    q_rows = b * sq_b + h * sq_h + offs_m * sq_t
    if CHUNKED:
        q = tl.zeros([BLOCK_M, DCH], dtype=Q.dtype.element_ty)        # placeholder, unused
    else:
        q = load_tile(Q + b * sq_b + h * sq_h, offs_m, sq_t, offs_d, sq_d, md_mask)
    Z, ZR = _tables(q, Q, q_rows, m_valid, sq_d, E, R, e_scale, scale, offs_d, d_valid, D, NPOS,
                    RNPOS, HAS_COPE, HAS_REL, NPOS_BLOCK, RNPOS_BLOCK, IEEE, CHUNKED, BLOCK_D,
                    DCH)
    qpos = offs_m
    if HAS_REL:
        qpos = tl.load(QPOS + b * T_Q + offs_m, mask=m_valid, other=0)
    k_base = b * sk_b + h * sk_h
    g_base = b * sg_b + h * sg_h
    v_base = b * sv_b + h * sv_h
    kv_ptr = KVALID + b * skv_b
    kpos_ptr = KPOS + b * T_K
    m_i, l_i, acc = softmax_state(BLOCK_M, BLOCK_D)
    c_i = tl.zeros([BLOCK_M], dtype=tl.float32)        # the gate carry (sum of visited gates)
    last, n_tiles = _tile_bounds(pid_m, T_K, Q_OFFSET, BLOCK_M, BLOCK_N)
    for i in range(0, n_tiles):                      # from the diagonal leftwards
        start_n = last - i * BLOCK_N
        logit, s, g, w, lo, hi, keep, c_i, ridx = _cope_tile(
            q, Z, ZR, c_i, Q, q_rows, m_valid, sq_d, K, GK, kv_ptr, kpos_ptr, k_base, g_base,
            sk_t, sk_d, sg_t, sg_d, qpos, offs_m, offs_d, d_valid, start_n, T_K, Q_OFFSET, D,
            scale, P_MAX, NPOS, RNPOS, HAS_KVALID, HAS_COPE, HAS_GK, HAS_REL, REL_EXTEND,
            BLOCK_N, IEEE, CHUNKED, BLOCK_D, DCH)
        x = logit * 1.4426950408889634
        m_new = tl.maximum(m_i, tl.max(x, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.math.exp2(x - m_use[:, None])
        alpha = tl.math.exp2(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, 1)
        offs_n = start_n + tl.arange(0, BLOCK_N)
        v = tl.load(V + v_base + offs_n[:, None] * sv_t + offs_d[None, :] * sv_d,
                    mask=(offs_n < T_K)[:, None] & d_valid[None, :], other=0.0)
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, IEEE)
        m_i = m_new
    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    tl.store(O + b * so_b + h * so_h + offs_m[:, None] * so_t + offs_d[None, :] * so_d,
             out.to(O.dtype.element_ty), mask=m_valid[:, None] & d_valid[None, :])
    lse = tl.where(empty, float("-inf"),
                   (m_i + tl.math.log2(tl.where(empty, 1.0, l_i))) * 0.6931471805599453)
    tl.store(LSE + pid_bh * T_Q + offs_m, lse, mask=m_valid)


def default_blocks(npos: int, block_d: int = 64,
                   dtype: torch.dtype = torch.float16) -> tuple[int, int, dict]:
    """(BLOCK_M, BLOCK_N, launch options). On a GPU 16 x 32 tiles (16 x 16 in fp32) for every
    table size: the former 64 x 64 (npos <= 128) and 32 x 64 tiles spill 0.5-1.6 KB per thread
    in fwd and bwd on sm_80 and sm_90 (`python -m attnlens.kernels.compile_check`). Tiles and launch
    options by dtype (and head size, where a row says so): `GPU_LAUNCH`, docs/benchmarks.md."""
    if not on_gpu():
        return 16, 16, dict(num_warps=4)
    fp32 = dtype == torch.float32
    rows = [r for r in GPU_LAUNCH if r[0] == fp32]
    _, _, bm, bn, launch = next((r for r in rows if block_d <= r[1]), rows[-1])
    return bm, bn, dict(launch)


def launch_args(q, k, pos_emb, gate_k, rel_emb, q_positions, k_positions, key_valid):
    """The optional inputs as kernel arguments: `(E, GK, R, QPOS, KPOS, KV, flags, sizes)`.

    Absent inputs become 1-element dummies (never read: their constexpr flag is off).
    """
    dummy = torch.zeros(1, device=q.device, dtype=q.dtype)
    idummy = torch.zeros(1, 1, device=q.device, dtype=torch.int32)
    E = dummy if pos_emb is None else pos_emb.contiguous()
    R = dummy if rel_emb is None else rel_emb.contiguous()
    GK = k if gate_k is None else gate_k
    has_rel = rel_emb is not None
    QPOS = q_positions.to(torch.int32).contiguous() if has_rel else idummy
    KPOS = k_positions.to(torch.int32).contiguous() if has_rel else idummy
    KV = key_valid if key_valid is not None else torch.empty(1, 1, dtype=torch.int8,
                                                             device=q.device)
    npos = 1 if pos_emb is None else pos_emb.shape[-1]
    rnpos = 1 if rel_emb is None else rel_emb.shape[-1]
    flags = dict(HAS_KVALID=key_valid is not None, HAS_COPE=pos_emb is not None,
                 HAS_GK=gate_k is not None, HAS_REL=has_rel)
    sizes = dict(NPOS_BLOCK=next_pow2(npos), RNPOS_BLOCK=next_pow2(rnpos + 1))
    return E, GK, R, QPOS, KPOS, KV, flags, sizes, npos, rnpos


def chunking(dtype: torch.dtype, block_d: int) -> dict:
    """`CHUNKED`, `DCH`: fp32 (IEEE dots) sums its products over d_head in chunks of
    `d_chunk` (16) read from memory, with no q / dO / dQ tile held in registers; the fp32
    backward spilled 184 B at d_head 128 on sm_80 with them (issue 23). fp16/bf16 keep one dot
    on register tiles (tensor cores; clean)."""
    chunked = dtype == torch.float32
    return dict(CHUNKED=chunked, DCH=d_chunk(block_d) if chunked else block_d)


def cope_fwd(q, k, v, pos_emb, scale: float, e_scale: float, key_valid=None,
             block_m: int | None = None, block_n: int | None = None, gate_k=None, rel_emb=None,
             q_positions=None, k_positions=None, rel_extend: bool = False):
    """Launch the forward; returns `(out [b q h d], lse [b h q] float32)`.

    `pos_emb` None: no CoPE term (a CoPE+rel layer without CoPE); `gate_k`: keys of the gates
    (default k); `rel_emb` with integer `q_positions [b q]`, `k_positions [b k]`: relative logits.
    """
    B, T_Q, H, D = q.shape
    T_K = k.shape[1]
    out = torch.empty_like(q)
    lse = torch.empty(B, H, T_Q, device=q.device, dtype=torch.float32)
    if T_Q == 0:
        return out, lse
    E, GK, R, QPOS, KPOS, KV, flags, sizes, npos, rnpos = launch_args(
        q, k, pos_emb, gate_k, rel_emb, q_positions, k_positions, key_valid)
    bm, bn, launch = default_blocks(max(npos, rnpos + 1), next_pow2(D), q.dtype)
    bm, bn = block_m or bm, block_n or bn
    cope_fwd_kernel[(math.ceil(T_Q / bm), B * H)](
        q, k, v, E, GK, R, QPOS, KPOS, out, lse, KV, *q.stride(), *k.stride(), *v.stride(),
        *GK.stride(), *out.stride(), KV.stride(0), H, T_Q, T_K, T_K - T_Q, D, npos, rnpos,
        scale, e_scale, float(npos - 1), **flags, REL_EXTEND=rel_extend,
        IEEE=q.dtype == torch.float32, BLOCK_M=bm, BLOCK_N=bn, BLOCK_D=next_pow2(D), **sizes,
        **chunking(q.dtype, next_pow2(D)), **launch)
    return out, lse


__all__ = ["MAX_NPOS", "chunking", "cope_fwd", "cope_fwd_kernel", "default_blocks",
           "launch_args"]
