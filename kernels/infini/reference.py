"""Plain-torch Infini-attention segment pass: the spec of the fused path.

One spec: this is `kernels.infini.naive.segment_pass`, which the variant imports too (paper
Eqs. 6-10: causal softmax inside each segment, read of the compressive memory built from the
previous segments, per-head gate, linear or delta update), re-exported with the argument order
of `kernels.infini.infini_attention`.

Example:
    >>> q = k = v = torch.randn(1, 10, 2, 8)
    >>> out, (M, z) = infini_reference(q, k, q, k, v, 4, torch.tensor([0.3, 0.7]))
    >>> out.shape, M.shape, z.shape
    (torch.Size([1, 10, 2, 8]), torch.Size([1, 2, 8, 8]), torch.Size([1, 2, 8]))
"""

from __future__ import annotations

from jaxtyping import Bool, Float
from torch import Tensor

from kernels.infini.naive import segment_pass


def infini_reference(qr: Float[Tensor, "batch pos head_index d_head"],
                     kr: Float[Tensor, "batch pos head_index d_head"],
                     q: Float[Tensor, "batch pos head_index d_head"],
                     k: Float[Tensor, "batch pos head_index d_head"],
                     v: Float[Tensor, "batch pos head_index d_head"],
                     segment_len: int,
                     gate: Float[Tensor, "head_index"],  # noqa: F821 (jaxtyping axis)
                     rule: str = "linear",
                     scale: float = 1.0, valid: Bool[Tensor, "batch pos"] | None = None,
                     detach_every: int = 0) -> tuple[Tensor, tuple[Tensor, Tensor]]:
    """`(A [batch pos head_index d_head], (M, z))` as `naive.segment_pass`.

    `qr`, `kr`: queries / keys with the local positional encoding; `q`, `k` without (the memory
    never sees positions). `scale` divides the local scores (the model's attn_scale); `gate` is
    sigmoid(beta) per head. All tensors in the memory dtype, as the variant calls it.
    """
    return segment_pass(qr, kr, q, k, v, valid, segment_len, gate, rule, scale, detach_every)


__all__ = ["infini_reference"]
