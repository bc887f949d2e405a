"""Row-block torch ops behind the "dcmha" training path (Xiao et al. 2024, arXiv 2405.08553).

`causal_dcmha_attention` runs the hooked layer's equations (scores, pre-softmax Compose, mask,
softmax, post-softmax Compose, values) over blocks of query rows that stop at the block's last
key, so the causal upper triangle is never computed and a block's maps stay in cache. Compose
mixes the heads of one (query t, key s) entry only, so it works block by block: the mixing
matrix there is `C_q(t) + C_k(s)`, a per-row plus a per-column `[n m]` matrix within each group
(`C_q = B + W_q`, `C_k = W_k`, variants.md section 3.2).
"""

from __future__ import annotations

import torch
from torch import Tensor

# Query rows per block: at the zoo shape (16 x 4 heads x 512 keys) a block's map is 4 MiB in
# fp32; blocks of 32 rows trained faster than blocks of 16 or 64 (docs/benchmarks.md).
FAST_BLOCK_ROWS = 32


def compose_rows(maps: Tensor, row_mixing: Tensor, key_mixing: Tensor | None) -> Tensor:
    """`out[m, t, s] = sum_n maps[n, t, s] (row_mixing[n, m, t] + key_mixing[n, m, s])`.

    `maps` is `[batch group n rows keys]`, `row_mixing` `[batch group n m rows]` and
    `key_mixing` `[batch group n m keys]` (None: no key-wise term). Returns
    `[batch group m rows keys]`. Each term is one batched matrix product over the heads.
    """
    out = torch.einsum("bgnts,bgnmt->bgmts", maps, row_mixing)
    if key_mixing is not None:
        out = out + torch.einsum("bgnts,bgnms->bgmts", maps, key_mixing)
    return out


def _by_position(mixing: Tensor | None) -> Tensor | None:
    """`[batch pos group n m]` -> `[batch group n m pos]`, so that blocks slice the last axis."""
    return None if mixing is None else mixing.permute(0, 2, 3, 4, 1)


def _block_mask(r0: int, r1: int, k0: int, window: int | None, device) -> Tensor:
    """`[rows keys]` mask of query rows [r0, r1) over keys [k0, r1): causal, and within
    `window` positions of the query on local layers."""
    rows = torch.arange(r0, r1, device=device)[:, None]
    keys = torch.arange(k0, r1, device=device)[None, :]
    allowed = keys <= rows
    return allowed if window is None else allowed & (rows - keys <= window)


def causal_dcmha_attention(q: Tensor, k: Tensor, v: Tensor,
                           pre: tuple[Tensor, Tensor | None], post: tuple[Tensor, Tensor | None],
                           scale: float, window: int | None = None,
                           block_rows: int | None = None) -> Tensor:
    """z `[batch query_pos head_index d_head]` of DCMHA on the plain causal mask.

    Args:
        q, k, v: `[batch pos head_index d_head]` (after QK-norm and rotary).
        pre, post: the phase's mixing matrices `(C_q, C_k)`, each `[batch pos group n m]`:
            `C_q(t) = B + W_q(t)` of the queries and `C_k(s) = W_k(s)` of the keys (None when
            query-wise), so that head m of the composed map is
            `sum_n (C_q(t)[n, m] + C_k(s)[n, m]) A_n[t, s]`.
        scale: the logit scale (1 / sqrt(d_head)).
        window: local layers: keys with q_pos - k_pos <= window only (None: global).
        block_rows: query rows per block (default FAST_BLOCK_ROWS).

    The block sizes depend on shapes only, so torch.compile unrolls the loop into one graph.
    Entries above the diagonal of a block (and outside the window) hold finite scores that
    Compose mixes only among themselves; the mask then drops them, as the hooked path's does.
    """
    n_q = q.shape[1]
    groups = pre[0].shape[2]
    rows = block_rows or FAST_BLOCK_ROWS
    q, k, v = (t.transpose(1, 2).contiguous() for t in (q, k, v))   # [batch head pos d_head]
    pre_q, pre_k, post_q, post_k = (_by_position(m) for m in (*pre, *post))
    out = []
    for r0 in range(0, n_q, rows):
        r1 = min(n_q, r0 + rows)
        k0 = 0 if window is None else max(0, r0 - window)
        allowed = _block_mask(r0, r1, k0, window, q.device)
        scores = (q[:, :, r0:r1] @ k[:, :, k0:r1].transpose(-1, -2)) * scale
        logits = compose_rows(scores.unflatten(1, (groups, -1)), pre_q[..., r0:r1],
                              None if pre_k is None else pre_k[..., k0:r1])
        work = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
        probs = torch.softmax(work.masked_fill(~allowed, float("-inf")), -1).to(logits.dtype)
        pattern = compose_rows(probs, post_q[..., r0:r1],
                               None if post_k is None else post_k[..., k0:r1])
        out.append(pattern.flatten(1, 2) @ v[:, :, k0:r1])
    return torch.cat(out, 2).transpose(1, 2)
