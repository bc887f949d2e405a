"""Standard causal multi-head attention (Vaswani et al. 2017): the "mha" variant."""

from __future__ import annotations

from torch import Tensor

from attnlens.hooked_models.attention.base import (
    AttentionContext,
    VariantAttention,
    mha_attend,
    mha_fast_attend,
)
from attnlens.hooked_models.attention.registry import register_attention


@register_attention("mha")
class MultiHeadAttention(VariantAttention):
    """softmax(q k^T / sqrt(d_head) + causal mask) v, with the two standard stages.

    With `cfg.backend` "triton" (or "auto" on CUDA) and no hook on `hook_attn_scores` /
    `hook_pattern`, the layer runs the fused kernel (`attnlens.kernels.flash_attention`), which
    never materialises the `[query, key]` map.

    Example:
        >>> from attnlens.hooked_models import VariantConfig, HookedVariantTransformer
        >>> model = HookedVariantTransformer(VariantConfig(d_model=32, d_head=8, n_layers=1,
        ...                                                n_ctx=16, d_vocab=50, seed=0))
        >>> [s.name for s in model.blocks[0].attn.stages]
        ['attn_scores', 'pattern']
    """

    attend = mha_attend
    fast_attend = mha_fast_attend

    def fused_attend(self, q: Tensor, k: Tensor, v: Tensor, ctx: AttentionContext) -> Tensor | None:
        """Fused causal attention (`attnlens.kernels.flash_attention`); None if the call does not
        fit."""
        from attnlens.kernels.flash_attention.dispatch import fused_causal_attention

        res = fused_causal_attention(q, k, v, ctx.allowed, 1.0 / self.cfg.attn_scale,
                                     keep_state=self.keep_fused_state)
        if res is None:
            return None
        z, self.fused_state = res
        return z
