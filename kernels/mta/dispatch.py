"""When an MTA layer's call fits the fused kernels, and the state kept to recompute patterns.

The kernels take the model's causal & key-padding masks (`key_valid_from_allowed`), fp16 / bf16
/ fp32, every option combination of the layer's maps (either convolution or mixing off, any
kernel size, any `pad_key`, grouped or full mixing). Not covered: float64 models and
incremental decoding with a KV cache (the query window of past rows), which take `attend`.
"""

from __future__ import annotations

from dataclasses import dataclass

from jaxtyping import Float
from torch import Tensor

from attnlens.kernels._triton import SUPPORTED_DTYPES
from attnlens.kernels.flash_attention.dispatch import LseState, key_valid_from_allowed
from attnlens.kernels.mta.function import mta_attention
from attnlens.kernels.mta.reference import mta_pattern_rows


@dataclass
class MTAState(LseState):
    """What one fused MTA call keeps for `pattern(heads, queries)` (see
    `attnlens.kernels.dispatch`).

    Attributes:
        q, k: queries / keys as the kernel saw them `[batch pos head_index d_head]` (detached);
        lse: row log-sum-exp of the mixed logits `[batch head_index query_pos]`; params: the
        four map parameters (detached, None where off); pad_key; scale; key_valid or None.
    """

    q: Tensor
    k: Tensor
    lse: Tensor
    params: tuple[Tensor | None, Tensor | None, Tensor | None, Tensor | None]
    pad_key: str
    scale: float
    key_valid: Tensor | None

    def pattern(self, heads: Tensor, queries: Tensor) -> Float[Tensor, "batch head query key"]:
        """Exact rows of `hook_pattern` `[batch len(heads) len(queries) key_pos]` (q's dtype):
        each from a band of c_q + c_q' - 1 score rows and the saved lse."""
        rows = mta_pattern_rows(self.q, self.k, self.lse, *self.params, self.pad_key,
                                self.scale, heads, queries, self.key_valid)
        return rows.to(self.q.dtype)


def fused_mta_attention(q: Tensor, k: Tensor, v: Tensor, allowed: Tensor,
                        params: tuple[Tensor | None, Tensor | None, Tensor | None, Tensor | None],
                        pad_key: str, scale: float, keep_state: bool = False,
                        ) -> tuple[Tensor, MTAState | None] | None:
    """`(z, state)` from the fused MTA kernels, or None when the call does not fit them.

    `params` = (pre-softmax kernel, pre-softmax mixing, post-softmax kernel, post-softmax
    mixing), each None when that step is off.
    """
    if q.dtype not in SUPPORTED_DTYPES or not (q.dtype == k.dtype == v.dtype):
        return None
    fits, key_valid = key_valid_from_allowed(allowed)
    if not fits:
        return None
    z, lse = mta_attention(q, k, v, *params, pad_key=pad_key, scale=scale, key_valid=key_valid)
    state = None
    if keep_state:
        state = MTAState(q.detach(), k.detach(), lse.detach(),
                         tuple(None if p is None else p.detach() for p in params), pad_key,
                         scale, None if key_valid is None else key_valid.clone())
    return z, state


__all__ = ["MTAState", "fused_mta_attention"]
