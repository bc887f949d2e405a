"""Rotary position embeddings (Su et al. 2021), GPT-NeoX ("half") and GPT-J ("adjacent") styles.

Only the first `rotary_dim` dims of each head rotate (Pythia rotates 25%); the rest pass through.
"""

from __future__ import annotations

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn


class Rotary(nn.Module):
    """Applies RoPE to `[batch, pos, head_index, d_head]` tensors at given integer positions.

    Example:
        >>> rope = Rotary(d_head=8, rotary_dim=8, n_ctx=16)
        >>> x = torch.randn(1, 4, 2, 8)
        >>> rope(x, torch.arange(4)[None]).shape
        torch.Size([1, 4, 2, 8])
    """

    def __init__(self, d_head: int, rotary_dim: int, n_ctx: int, base: float = 10000.0,
                 adjacent_pairs: bool = False):
        super().__init__()
        self.rotary_dim = rotary_dim
        self.adjacent_pairs = adjacent_pairs
        inv_freq = 1.0 / base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
        angles = torch.arange(n_ctx, dtype=torch.float64)[:, None] * inv_freq[None, :]
        if adjacent_pairs:
            angles = angles.repeat_interleave(2, dim=-1)
        else:
            angles = torch.cat([angles, angles], dim=-1)
        # Kept in float64 and cast at use, so fp16 models still rotate with exact angles.
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def _rotate(self, x: Tensor) -> Tensor:
        if self.adjacent_pairs:
            x1, x2 = x[..., 0::2], x[..., 1::2]
            return torch.stack([-x2, x1], dim=-1).flatten(-2)
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat([-x2, x1], dim=-1)

    def forward(
        self, x: Float[Tensor, "batch pos head_index d_head"], positions: Int[Tensor, "batch pos"]
    ) -> Float[Tensor, "batch pos head_index d_head"]:
        if positions.max() >= self.cos.shape[0]:
            raise ValueError(f"rotary position {int(positions.max())} exceeds the table of "
                             f"{self.cos.shape[0]} positions (n_ctx)")
        rd = self.rotary_dim
        cos = self.cos[positions][:, :, None, :].to(x.dtype)
        sin = self.sin[positions][:, :, None, :].to(x.dtype)
        x_rot, x_pass = x[..., :rd], x[..., rd:]
        x_rot = x_rot * cos + self._rotate(x_rot) * sin
        return torch.cat([x_rot, x_pass], dim=-1)
