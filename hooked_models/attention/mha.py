"""Standard causal multi-head attention (Vaswani et al. 2017): the "mha" variant."""

from __future__ import annotations

from hooked_models.attention.base import VariantAttention, mha_attend
from hooked_models.attention.registry import register_attention


@register_attention("mha")
class MultiHeadAttention(VariantAttention):
    """softmax(q k^T / sqrt(d_head) + causal mask) v, with the two standard stages.

    Example:
        >>> from hooked_models import VariantConfig, HookedVariantTransformer
        >>> model = HookedVariantTransformer(VariantConfig(d_model=32, d_head=8, n_layers=1,
        ...                                                n_ctx=16, d_vocab=50, seed=0))
        >>> [s.name for s in model.blocks[0].attn.stages]
        ['attn_scores', 'pattern']
    """

    attend = mha_attend
