"""When a CoPE layer's call fits the fused kernel, and the state kept to recompute patterns.

The fused kernel covers gates from the content scores (the paper's default), both scalings, the
model's causal & key-padding masks, and position tables small enough for registers
(`MAX_NPOS` on GPU). Separate gate keys, value gates and relative-position logits take the
materialising path.
"""

from __future__ import annotations

from dataclasses import dataclass

from jaxtyping import Float
from torch import Tensor

from kernels._triton import SUPPORTED_DTYPES, on_gpu
from kernels.cope.function import cope_attention
from kernels.cope.reference import cope_pattern_rows
from kernels.cope.triton_fwd import MAX_NPOS
from kernels.flash_attention.dispatch import LseState, key_valid_from_allowed


@dataclass
class CoPEState(LseState):
    """What one fused CoPE call keeps for `pattern(heads, queries)` (see `kernels.dispatch`).

    Attributes:
        q, k: queries / keys as the kernel saw them `[batch pos head_index d_head]` (detached);
        pos_emb: E `[d_head npos]`; lse `[batch head_index query_pos]`; key_valid `[batch
        key_pos]` or None; scale: the score multiplier; scaling: "paper" or "repo".
    """

    q: Tensor
    k: Tensor
    pos_emb: Tensor
    lse: Tensor
    key_valid: Tensor | None
    scale: float
    scaling: str

    def pattern(self, heads: Tensor, queries: Tensor) -> Float[Tensor, "batch head query key"]:
        """Exact rows of `hook_pattern` `[batch len(heads) len(queries) key_pos]`."""
        return cope_pattern_rows(self.q, self.k, self.pos_emb, self.lse, self.scale,
                                 self.scaling, heads, queries, self.key_valid)


def fused_cope_attention(q: Tensor, k: Tensor, v: Tensor, pos_emb: Tensor, allowed: Tensor,
                         scale: float, scaling: str = "paper", keep_state: bool = False,
                         ) -> tuple[Tensor, CoPEState | None] | None:
    """`(z, state)` from the fused CoPE kernel, or None when the call does not fit it."""
    if q.dtype not in SUPPORTED_DTYPES or not (q.dtype == k.dtype == v.dtype):
        return None
    if on_gpu() and pos_emb.shape[-1] > MAX_NPOS:
        return None
    fits, key_valid = key_valid_from_allowed(allowed)
    if not fits:
        return None
    z, lse = cope_attention(q, k, v, pos_emb, scale, scaling, key_valid)
    state = None
    if keep_state:
        state = CoPEState(q.detach(), k.detach(), pos_emb.detach(), lse.detach(),
                          None if key_valid is None else key_valid.clone(), scale, scaling)
    return z, state


__all__ = ["CoPEState", "fused_cope_attention"]
