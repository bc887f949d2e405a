"""When a CoPE layer's call fits the fused kernel, and the state kept to recompute patterns.

The fused kernel covers every official option: gates from the content scores (the paper's
default), from separate gate keys (sep-keys) or from the values (val-gates), both scalings,
CoPE+rel relative logits (rel_extend included, padding-aware positions), a CoPE+rel layer
without CoPE, and the model's causal & key-padding masks. What remains outside: float64 (the
exactness path, by design) and, on a GPU, position tables too long for registers (`MAX_NPOS`):
those calls take the materialising path with a warning, once per option, naming it.

Example (CUDA, or CPU with TRITON_INTERPRET=1):
    >>> z, state = fused_cope_attention(q, k, v, E, allowed, 0.25, gate_k=v)   # doctest: +SKIP
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

from jaxtyping import Float
from torch import Tensor

from attnlens.kernels._triton import SUPPORTED_DTYPES, on_gpu
from attnlens.kernels.cope.function import cope_attention
from attnlens.kernels.cope.reference import DEFAULT_SCALING, cope_pattern_rows
from attnlens.kernels.cope.triton_fwd import MAX_NPOS
from attnlens.kernels.flash_attention.dispatch import LseState, key_valid_from_allowed

_WARNED: set[str] = set()


def warn_fallback_once(option: str, why: str) -> None:
    """One warning per process and option: the fused CoPE path was not taken because of it."""
    if option not in _WARNED:
        _WARNED.add(option)
        warnings.warn(f"CoPE option {option}: {why}; this layer takes the materialising "
                      "O(T^2)-memory torch path", stacklevel=3)


@dataclass
class CoPEState(LseState):
    """What one fused CoPE call keeps for `pattern(heads, queries)` (see
    `attnlens.kernels.dispatch`).

    Attributes:
        q, k: queries / keys as the kernel saw them `[batch pos head_index d_head]` (detached);
        pos_emb: E `[d_head npos]` or None (no CoPE term); lse `[batch head_index query_pos]`;
        key_valid `[batch key_pos]` or None; scale: the score multiplier; scaling: "paper" or
        "repo"; options: gate_k, rel_emb, q_positions, k_positions, rel_extend as passed to
        `cope_attention` (detached).
    """

    q: Tensor
    k: Tensor
    pos_emb: Tensor | None
    lse: Tensor
    key_valid: Tensor | None
    scale: float
    scaling: str
    options: dict

    def pattern(self, heads: Tensor, queries: Tensor) -> Float[Tensor, "batch head query key"]:
        """Exact rows of `hook_pattern` `[batch len(heads) len(queries) key_pos]`."""
        return cope_pattern_rows(self.q, self.k, self.pos_emb, self.lse, self.scale,
                                 self.scaling, heads, queries, self.key_valid, **self.options)


def _detach(t: Tensor | None) -> Tensor | None:
    return None if t is None else t.detach()


def fused_cope_attention(q: Tensor, k: Tensor, v: Tensor, pos_emb: Tensor | None,
                         allowed: Tensor, scale: float, scaling: str = DEFAULT_SCALING,
                         keep_state: bool = False, *, gate_k: Tensor | None = None,
                         rel_emb: Tensor | None = None, q_positions: Tensor | None = None,
                         k_positions: Tensor | None = None, rel_extend: bool = False,
                         ) -> tuple[Tensor, CoPEState | None] | None:
    """`(z, state)` from the fused CoPE kernel, or None when the call does not fit it.

    Arguments as `function.cope_attention` (`allowed [batch 1 q k]` is the layer's mask).
    """
    tensors = [t for t in (q, k, v, gate_k) if t is not None]
    if q.dtype not in SUPPORTED_DTYPES or any(t.dtype != q.dtype for t in tensors):
        return None
    if on_gpu():
        if pos_emb is not None and pos_emb.shape[-1] > MAX_NPOS:
            warn_fallback_once("npos_max", f"{pos_emb.shape[-1]} position embeddings exceed "
                               f"the {MAX_NPOS} a GPU kernel keeps in registers")
            return None
        if rel_emb is not None and rel_emb.shape[-1] + 1 > MAX_NPOS:
            warn_fallback_once("rel_npos", f"{rel_emb.shape[-1]} relative embeddings exceed "
                               f"the {MAX_NPOS - 1} a GPU kernel keeps in registers")
            return None
    fits, key_valid = key_valid_from_allowed(allowed)
    if not fits:
        return None
    options = dict(gate_k=gate_k, rel_emb=rel_emb, q_positions=q_positions,
                   k_positions=k_positions, rel_extend=rel_extend)
    z, lse = cope_attention(q, k, v, pos_emb, scale, scaling, key_valid, **options)
    state = None
    if keep_state:
        kept = {name: (_detach(t) if name != "rel_extend" else t) for name, t in options.items()}
        state = CoPEState(q.detach(), k.detach(), _detach(pos_emb), lse.detach(),
                          None if key_valid is None else key_valid.clone(), scale, scaling,
                          kept)
    return z, state


__all__ = ["CoPEState", "fused_cope_attention", "warn_fallback_once"]
