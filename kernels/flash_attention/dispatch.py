"""When a layer's call fits the fused causal kernel, and the state kept to recompute patterns.

The model builds `allowed [batch 1 query_pos key_pos]` as "causal with the queries aligned to the
last keys" AND "key is not padding" (`HookedVariantTransformer._masks`). The fused kernel takes
exactly that family: a KV offset plus a key-valid vector. `fused_causal_attention` reads the
key-valid vector off the last query row and checks the structure on O(T) entries (diagonal,
first super-diagonal, first column); any other mask returns None and the layer materialises.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Float
from torch import Tensor

from attnlens.kernels._triton import SUPPORTED_DTYPES
from attnlens.kernels.flash_attention.function import flash_attention
from attnlens.kernels.flash_attention.reference import pattern_rows


class LseState:
    """Shape facts shared by the states a fused layer saves for `patterns_for` (row lse
    `[batch head_index query_pos]` in `self.lse`)."""

    lse: Tensor

    @property
    def n_heads(self) -> int:
        return self.lse.shape[1]

    @property
    def n_queries(self) -> int:
        return self.lse.shape[2]

    @property
    def device(self) -> torch.device:
        return self.lse.device


@dataclass
class FlashState(LseState):
    """What one fused call keeps for `pattern(heads, queries)` (see `attnlens.kernels.dispatch`).

    Attributes:
        q, k: the queries / keys the kernel saw (after rotary) `[batch pos head_index d_head]`,
            detached.
        lse: row log-sum-exp `[batch head_index query_pos]` (float32), -inf on empty rows.
        key_valid: `[batch key_pos]` bool or None; scale: the score multiplier.
    """

    q: Tensor
    k: Tensor
    lse: Tensor
    key_valid: Tensor | None
    scale: float

    def pattern(self, heads: Tensor, queries: Tensor) -> Float[Tensor, "batch head query key"]:
        """Exact rows of `hook_pattern` `[batch len(heads) len(queries) key_pos]` (q's dtype)."""
        return pattern_rows(self.q, self.k, self.lse, self.scale, heads, queries,
                            self.key_valid)


def key_valid_from_allowed(allowed: Tensor) -> tuple[bool, Tensor | None]:
    """`(fits, key_valid)`: whether `allowed` is causal (KV offset) & a key mask, and that mask.

    `key_valid` is None when every key is valid. O(batch * T) work (views and one sync).
    """
    if allowed.ndim != 4 or allowed.shape[1] != 1:
        return False, None
    n_q, n_k = allowed.shape[-2:]
    if n_q > n_k or n_q == 0:
        return False, None
    a = allowed[:, 0]
    offset = n_k - n_q
    key_valid = a[:, -1, :]                                    # last query sees every key <= it
    checks = [(a.diagonal(offset, -2, -1) == key_valid[:, offset:]).all(),
              (a[:, :, 0] == key_valid[:, :1]).all()]
    above = a.diagonal(offset + 1, -2, -1)                    # just above the causal edge
    if above.numel():
        checks.append(~above.any())
    checks.append(key_valid.all())
    flags = torch.stack(checks).tolist()                       # one device sync
    if not all(flags[:-1]):
        return False, None
    return True, (None if flags[-1] else key_valid)


def fused_causal_attention(q: Float[Tensor, "batch query_pos head_index d_head"],
                           k: Float[Tensor, "batch key_pos head_index d_head"],
                           v: Float[Tensor, "batch key_pos head_index d_head"],
                           allowed: Tensor, scale: float, keep_state: bool = False,
                           ) -> tuple[Tensor, FlashState | None] | None:
    """`(z, state)` from the fused kernel, or None when the call does not fit it.

    Does not fit: dtypes other than fp16/bf16/fp32 (e.g. float64 models), masks outside the
    causal & key-padding family. `state` is a `FlashState` when `keep_state`, else None.
    """
    if q.dtype not in SUPPORTED_DTYPES or not (q.dtype == k.dtype == v.dtype):
        return None
    fits, key_valid = key_valid_from_allowed(allowed)
    if not fits:
        return None
    z, lse = flash_attention(q, k, v, scale, key_valid)
    state = None
    if keep_state:
        state = FlashState(q.detach(), k.detach(), lse.detach(),
                           None if key_valid is None else key_valid.clone(), scale)
    return z, state


__all__ = ["FlashState", "fused_causal_attention", "key_valid_from_allowed"]
