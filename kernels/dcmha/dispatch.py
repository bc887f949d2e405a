"""When a DCMHA layer's call fits the fused kernels, and the state kept to recompute patterns.

The kernels take the model's causal & key-padding masks (`key_valid_from_allowed`), a window
given as an int (local layers), fp16 / bf16 / fp32, every option combination of the maps (rank,
groups, query-wise, static B). Not covered, and taking `attend`: float64 models, incremental
decoding with a KV cache (the layer's cached key-wise matrices), and windowed layers whose
positions are not the token indices (the window is on positions; see `window_fits`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

from attnlens.kernels._triton import SUPPORTED_DTYPES
from attnlens.kernels.dcmha.function import dcmha_attention
from attnlens.kernels.dcmha.reference import ComposeWeights, dcmha_pattern_rows
from attnlens.kernels.flash_attention.dispatch import LseState, key_valid_from_allowed


@dataclass
class DCMHAState(LseState):
    """What one fused DCMHA call keeps for `pattern(heads, queries)` (see
    `attnlens.kernels.dispatch`).

    Attributes:
        q, k: queries / keys as the kernel saw them `[batch pos head_index d_head]` (detached);
        lse: row log-sum-exp of the composed logits `[batch head_index query_pos]`; pre, post:
        the compose weights (detached, O(T)); scale; window; key_valid or None.
    """

    q: Tensor
    k: Tensor
    lse: Tensor
    pre: ComposeWeights
    post: ComposeWeights
    scale: float
    window: int | None
    key_valid: Tensor | None

    def pattern(self, heads: Tensor, queries: Tensor) -> Float[Tensor, "batch head query key"]:
        """Exact rows of `hook_pattern` `[batch len(heads) len(queries) key_pos]` (q's dtype):
        all heads' logits of the chosen rows (Compose mixes heads), the saved lse."""
        work = torch.float32 if self.q.dtype != torch.float64 else torch.float64
        rows = dcmha_pattern_rows(self.q.to(work), self.k.to(work), self.lse, self.pre,
                                  self.post, self.scale, heads, queries, self.window,
                                  self.key_valid)
        return rows.to(self.q.dtype)


def window_fits(q_positions: Tensor, k_positions: Tensor, key_valid: Tensor | None) -> bool:
    """Whether a window on positions is the kernels' window on indices for every pair that
    matters: valid keys' positions are their indices plus one shift per batch row, and so are
    the positions of query rows that see any key (queries aligned to the last keys). Padding
    positions (e.g. the clamped left padding) are free. O(batch * T), one sync."""
    t_q, t_k = q_positions.shape[1], k_positions.shape[1]
    idx = torch.arange(t_k, device=k_positions.device)
    valid = (torch.ones_like(k_positions, dtype=torch.bool) if key_valid is None
             else key_valid.bool())
    shift = k_positions - idx
    ref = shift.gather(1, valid.int().argmax(-1, keepdim=True))      # at the first valid key
    seen = valid.cumsum(-1)[:, t_k - t_q:] > 0                        # row has a valid key
    q_shift = q_positions - idx[t_k - t_q:]
    return bool(((shift == ref) | ~valid).all() & ((q_shift == ref) | ~seen).all())


def dcmha_call_fits(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor, window: int | None,
                    positions: tuple[Tensor, Tensor] | None = None
                    ) -> tuple[bool, Tensor | None]:
    """`(fits, key_valid)`: whether the fused kernels cover this call, checked before the
    layer fires its dynamic-weight hooks (so that a fallback does not fire them twice).

    `allowed` is the causal & padding mask `[batch 1 q k]` without the window; `window` the
    layer's (None: global), on `positions` = (query, key) positions when given."""
    if q.dtype not in SUPPORTED_DTYPES or not (q.dtype == k.dtype == v.dtype):
        return False, None
    fits, key_valid = key_valid_from_allowed(allowed)
    if not fits or (window is not None and positions is not None
                    and not window_fits(*positions, key_valid)):
        return False, None
    return True, key_valid


def fused_dcmha_attention(q: Tensor, k: Tensor, v: Tensor, key_valid: Tensor | None,
                          pre: ComposeWeights, post: ComposeWeights, scale: float,
                          window: int | None = None, keep_state: bool = False,
                          ) -> tuple[Tensor, DCMHAState | None]:
    """`(z, state)` from the fused DCMHA kernels for a call `dcmha_call_fits` accepted."""
    z, lse = dcmha_attention(q, k, v, pre, post, scale=scale, window=window,
                             key_valid=key_valid)
    state = None
    if keep_state:
        state = DCMHAState(q.detach(), k.detach(), lse.detach(), pre.map(torch.Tensor.detach),
                           post.map(torch.Tensor.detach), scale, window,
                           None if key_valid is None else key_valid.clone())
    return z, state


__all__ = ["DCMHAState", "dcmha_call_fits", "fused_dcmha_attention", "window_fits"]
