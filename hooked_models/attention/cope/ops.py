"""Memory-bounded torch ops behind the "cope" attention (Golovneva et al. 2024, arXiv 2405.18719).

`context_positions` (paper eq. 4 plus the `npos_max` clamp) and `interpolate_position_logits`
(eq. 7: the table q.e[n] for integer n, interpolated at p) are autograd Functions that walk the
query axis in blocks of rows. Beyond the `[..., query, key]` map each one returns they allocate
O(block) temporaries, and their backward saves only their inputs (maps the layer produces anyway
and the O(T * npos_max) table), recomputing floors and weights block by block: no `[query, key]`
index or weight tensor is ever kept, and e[p] is never materialised per pair.

`safe_softmax` gives zero rows, and zero gradients, for queries that may read no key.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from attnlens.hooked_models.attention.base import is_plain_causal

# Elements per block of rows (2^20: 4 MiB in fp32). The temporaries are a few blocks, whatever
# T is; blocks this large keep the number of parallel regions low on a loaded CPU.
BLOCK_ELEMENTS = 1 << 20


def _row_blocks(x: Tensor) -> list[slice]:
    """Slices of the second-to-last axis of `x` holding about BLOCK_ELEMENTS elements each."""
    rows = x.shape[-2]
    per_row = max(1, x.numel() // max(rows, 1))
    step = max(1, BLOCK_ELEMENTS // per_row)
    return [slice(r, min(r + step, rows)) for r in range(0, rows, step)]


def _reverse_cumsum(x: Tensor) -> Tensor:
    """sum_{t >= j} x[..., t] for every j: the sum from key j up to the query (eq. 4)."""
    return x.flip(-1).cumsum_(-1).flip(-1)


def _count_dtype(dtype: torch.dtype) -> torch.dtype:
    # fp16 cannot count past 2048 exactly (bf16: 256), so positions are summed in float32.
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


class _ContextPositions(torch.autograd.Function):
    """p_ij = min(sum_{t=j}^{i} g_it, p_max) over the last axis (keys), computed in row blocks."""

    @staticmethod
    def forward(ctx, gates: Tensor, p_max: float) -> Tensor:
        work = _count_dtype(gates.dtype)
        out = torch.empty(gates.shape, dtype=work, device=gates.device)
        for rows in _row_blocks(gates):
            # Clamped while the block is contiguous and in cache, then copied into place.
            out[..., rows, :] = _reverse_cumsum(gates[..., rows, :].to(work)).clamp_(max=p_max)
        ctx.save_for_backward(gates)
        ctx.p_max = p_max
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_p: Tensor):
        (gates,) = ctx.saved_tensors
        work = _count_dtype(gates.dtype)
        grad = torch.empty_like(gates)
        for rows in _row_blocks(gates):
            # d p_ij / d g_it = 1 for t >= j while p_ij is not clamped (torch.clamp's convention:
            # the gradient passes at equality), so dL/dg_it = sum_{j <= t} dL/dp_ij [unclamped].
            unclamped = _reverse_cumsum(gates[..., rows, :].to(work)) <= ctx.p_max
            grad[..., rows, :] = (grad_p[..., rows, :] * unclamped).cumsum(-1)
        return grad, None


def _floor_and_weight(p: Tensor, n: int, dtype: torch.dtype,
                      clamp: bool = True) -> tuple[Tensor, Tensor]:
    """floor(p) as int64 index (p clamped to [0, n-1]) and the ceiling weight w = p - floor(p).

    `clamp=False` skips the clamp for positions known to lie in [0, n-1] already.
    """
    if clamp:
        p = p.clamp(0, n - 1)
    # truncation == floor for p >= 0; carries no gradient (paper appendix). A NaN position
    # (NaN weights or inputs) indexes 0 and stays NaN through w, instead of an index error.
    lo = p.nan_to_num(nan=0.0).long()
    return lo, (p - lo).to(dtype)


def _forward_diff(table: Tensor) -> Tensor:
    """table[..., n+1] - table[..., n], with 0 after the last position (nothing to climb to)."""
    return torch.diff(table, dim=-1, append=torch.zeros_like(table[..., :1]))


class _InterpolatedLogits(torch.autograd.Function):
    """out[..., i, j] = (1 - w) * table[..., i, floor(p_ij)] + w * table[..., i, ceil(p_ij)]."""

    @staticmethod
    def forward(ctx, table: Tensor, positions: Tensor, in_range: bool) -> Tensor:
        n = table.shape[-1]
        out = torch.empty(positions.shape, dtype=table.dtype, device=table.device)
        diff = _forward_diff(table)
        for rows in _row_blocks(positions):
            lo, w = _floor_and_weight(positions[..., rows, :], n, table.dtype, not in_range)
            # table[floor] + w * (table[floor+1] - table[floor]) == eq. 7 (also when p is whole).
            torch.addcmul(table[..., rows, :].gather(-1, lo), w,
                          diff[..., rows, :].gather(-1, lo), out=out[..., rows, :])
        ctx.save_for_backward(table, positions)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor):
        table, positions = ctx.saved_tensors
        n = table.shape[-1]
        want_table, want_pos = ctx.needs_input_grad[:2]
        grad_table = torch.zeros_like(table) if want_table else None
        grad_pos = torch.empty_like(positions) if want_pos else None
        diff = _forward_diff(table) if want_pos else None
        for rows in _row_blocks(positions):
            p = positions[..., rows, :]
            lo, w = _floor_and_weight(p, n, table.dtype)
            g = grad_out[..., rows, :]
            if want_pos:
                # The weight w carries the gradient (floor does not); outside [0, n-1] the clamp
                # stops it. At whole p this is the right derivative table[p+1] - table[p].
                gp = (g * diff[..., rows, :].gather(-1, lo)).to(positions.dtype)
                grad_pos[..., rows, :] = gp.masked_fill_((p < 0) | (p > n - 1), 0)
            if want_table:
                block = grad_table[..., rows, :]
                block.scatter_add_(-1, lo, g * (1 - w))
                block.scatter_add_(-1, (lo + 1).clamp_(max=n - 1), g * w)
        return grad_table, grad_pos, None


def context_positions(gates: Tensor, npos_max: int) -> Tensor:
    """Contextual positions p_ij = sum_{t=j}^{i} g_it, clamped to npos_max - 1 (paper eq. 4).

    Args:
        gates: `[..., query_pos, key_pos]` gates, zero for keys a query may not read.
        npos_max: number of position embeddings; positions saturate at npos_max - 1.

    Returns:
        `[..., query_pos, key_pos]` positions (float32 for 16-bit gates, else the gates' dtype).

    Example:
        >>> context_positions(torch.tensor([[1.0, 0.0], [0.5, 1.0]]), npos_max=8)
        tensor([[1.0000, 0.0000],
                [1.5000, 1.0000]])
    """
    return _ContextPositions.apply(gates, float(npos_max - 1))


def interpolate_position_logits(table: Tensor, positions: Tensor,
                                in_range: bool = False) -> Tensor:
    """q_i.e[p_ij] by linear interpolation of the integer-position table (paper eq. 7).

    Args:
        table: `[..., query_pos, npos]` with table[..., i, n] = q_i.e[n] for every integer n.
        positions: `[..., query_pos, key_pos]` (same leading dims), clamped to [0, npos-1].
        in_range: promise that positions already lie in [0, npos-1] (as `context_positions`
            returns them), which skips the clamp.

    Returns:
        `[..., query_pos, key_pos]`: (p - floor p) table[ceil p] + (1 - p + floor p) table[floor p].
        floor/ceil carry no gradient; the weight p - floor p does.

    Example:
        >>> table = torch.tensor([[0.0, 10.0, 30.0]])
        >>> interpolate_position_logits(table, torch.tensor([[0.5, 1.25, 7.0]]))
        tensor([[ 5., 15., 30.]])
    """
    return _InterpolatedLogits.apply(table, positions, in_range)


def safe_softmax(logits: Tensor, allowed: Tensor) -> Tensor:
    """Softmax over keys (in >= float32); rows with no allowed key are zero, never NaN.

    Fully masked rows (padding) are softmaxed as zeros and then zeroed, so neither the forward
    nor the backward pass ever sees exp(-inf) / 0.
    """
    work = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    live = allowed.any(-1, keepdim=True)
    if is_plain_causal(allowed) or bool(live.all()):
        return torch.softmax(work, dim=-1).to(logits.dtype)
    pattern = torch.softmax(work.masked_fill(~live, 0.0), dim=-1)
    return pattern.masked_fill(~live, 0.0).to(logits.dtype)



# Elements of one [batch, head, rows, keys] block of the causal fast path: small enough that a
# block's chain of element-wise ops stays in cache (measured at the zoo shape: 32 rows of
# 16 x 4 x 512 ran the training step 3x faster than 128 rows), but at least MIN_FAST_ROWS rows
# so that long contexts unroll into few blocks under torch.compile.
FAST_BLOCK_ELEMENTS = 1 << 20
MIN_FAST_ROWS = 32


def causal_cope_attention(q: Tensor, k: Tensor, v: Tensor, gate_k: Tensor | None, emb: Tensor,
                          scale: float, pos_scale: float, npos_max: int,
                          block_rows: int | None = None) -> Tensor:
    """z `[batch query_pos head_index d_head]` of CoPE on the plain causal mask (eqs. 3-7).

    The training path: the hooked layer's equations in plain differentiable ops, by blocks of
    query rows that stop at the block's last key (the causal upper triangle is never computed)
    and hold whole rows, so every block softmaxes on its own; its maps stay in cache. `gate_k`
    gives the gate logits q.gate_k (None: the content scores), `emb` is e `[d_head npos_max]`,
    `pos_scale` multiplies q.e (1/sqrt(d) under "repo" scaling). The block sizes depend on
    shapes only, so torch.compile unrolls the loop into one graph.
    """
    batch, n_q, n_heads, _ = q.shape
    if block_rows is None:
        block_rows = max(MIN_FAST_ROWS, FAST_BLOCK_ELEMENTS // (batch * n_heads * n_q))
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))     # [batch head pos d_head]
    gate_k = k if gate_k is None else gate_k.transpose(1, 2)
    p_max = float(npos_max - 1)
    out = []
    for r0 in range(0, n_q, block_rows):
        r1 = min(n_q, r0 + block_rows)
        qb = q[:, :, r0:r1]
        causal = torch.ones(r1 - r0, r1, dtype=torch.bool, device=q.device).tril(r0)
        scores = (qb @ k[:, :, :r1].transpose(-1, -2)) * scale
        gate_logits = scores if gate_k is k else (qb @ gate_k[:, :, :r1].transpose(-1, -2)) * scale
        gates = torch.where(causal, torch.sigmoid(gate_logits), 0.0)            # eq. 3
        p = gates.flip(-1).cumsum(-1).flip(-1)                                # eq. 4
        if p_max < r1:   # p_ij <= i - j + 1 <= r1: below that the clamp never acts
            p = p.clamp(max=p_max)
        # eq. 7 on the table q.e[n] of the positions this block can reach (n <= r1)
        n_tab = min(npos_max, r1 + 1)
        table = (qb @ emb[:, :n_tab].to(q.dtype)) * pos_scale
        lo = p.detach().nan_to_num(nan=0.0).long()   # floor (p >= 0), no gradient
        t_lo = table.gather(-1, lo)
        t_hi = table.gather(-1, (lo + 1).clamp_(max=n_tab - 1))   # at p = n-1 the weight is 0
        logits = scores + t_lo + (p - lo) * (t_hi - t_lo)                      # eq. 6
        pattern = torch.softmax(logits.masked_fill(~causal, float("-inf")), -1)
        out.append(pattern @ v[:, :, :r1])
    return torch.cat(out, 2).transpose(1, 2)
