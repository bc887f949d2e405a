"""Rotary position embeddings (Su et al. 2021), GPT-NeoX ("half") and GPT-J ("adjacent") styles.

Only the first `rotary_dim` dims of each head rotate (Pythia rotates 25%); the rest pass through.

Frequency scaling (`cfg.rope_scaling`, HuggingFace's `rope_scaling` / `rope_parameters`) rescales
the inverse frequencies `inv_freq[i] = base ** (-2i / rotary_dim)`:

- "linear" (position interpolation, Chen et al. 2023): `inv_freq / factor`;
- "llama3" (Llama-3.1/3.2): wavelengths `2 pi / inv_freq` longer than
  `original_max_position_embeddings / low_freq_factor` are divided by `factor`, shorter than
  `original_max_position_embeddings / high_freq_factor` are kept, and the band between is
  interpolated linearly in `original_max_position_embeddings / wavelength`;
- "dynamic" (dynamic NTK): while the call's positions fit in `original_max_position_embeddings`
  the frequencies are the plain ones; beyond, with `L = max(positions) + 1`, the base becomes
  `base * (factor * L / original - (factor - 1)) ** (d / (d - 2))` for all positions of the call
  (HuggingFace's forward from an empty cache; its angles depend on the call's length).

All angles are computed in float64 and cast at use.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

# rope type -> its parameters (all required); "default" means no scaling (rope_scaling=None).
ROPE_SCALING_KEYS: dict[str, tuple[str, ...]] = {
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor",
               "original_max_position_embeddings"),
    "dynamic": ("factor", "original_max_position_embeddings"),
}
_NOT_YET = ("yarn", "longrope")


def _positive_float(key: str, value: Any) -> float:
    if (isinstance(value, bool) or not isinstance(value, (int, float))
            or not math.isfinite(value) or value <= 0):
        raise ValueError(f"rope_scaling[{key!r}] must be a finite number > 0, got {value!r}")
    return float(value)


def normalize_rope_scaling(value: Any) -> dict[str, Any] | None:
    """The validated, canonical form of a rope-scaling spec (None: plain RoPE).

    Accepts HuggingFace's spelling (`rope_type`, or the older alias `type`); `factor` and the
    frequency factors become floats, `original_max_position_embeddings` a positive int. Unknown
    types, missing or unknown keys and bad values raise ValueError naming the key.

    Example:
        >>> normalize_rope_scaling({"type": "linear", "factor": 2})
        {'rope_type': 'linear', 'factor': 2.0}
    """
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError(f"rope_scaling must be None or a dict, got {type(value).__name__}")
    spec = dict(value)
    if "type" in spec and "rope_type" in spec and spec["type"] != spec["rope_type"]:
        raise ValueError(f"rope_scaling has rope_type={spec['rope_type']!r} and "
                         f"type={spec['type']!r}; give one")
    rope_type = spec.pop("rope_type", spec.pop("type", None))
    spec.pop("type", None)
    if rope_type == "default" and not spec:
        return None
    if rope_type in _NOT_YET:
        raise ValueError(f"rope_scaling rope_type={rope_type!r} is not supported yet; "
                         f"supported: {list(ROPE_SCALING_KEYS)}")
    if rope_type not in ROPE_SCALING_KEYS:
        raise ValueError(f"rope_scaling rope_type={rope_type!r} is not supported; choose one of "
                         f"{list(ROPE_SCALING_KEYS)} (or rope_scaling=None for plain RoPE)")
    keys = ROPE_SCALING_KEYS[rope_type]
    missing = [k for k in keys if k not in spec]
    unknown = sorted(set(spec) - set(keys))
    if missing or unknown:
        raise ValueError(f"rope_scaling for rope_type={rope_type!r} needs exactly {list(keys)}"
                         + (f"; missing {missing}" if missing else "")
                         + (f"; unknown {unknown}" if unknown else ""))
    out: dict[str, Any] = {"rope_type": rope_type}
    for key in keys:
        if key == "original_max_position_embeddings":
            n = spec[key]
            if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
                raise ValueError(f"rope_scaling[{key!r}] must be a positive int, got {n!r}")
            out[key] = n
        else:
            out[key] = _positive_float(key, spec[key])
    if rope_type == "llama3" and out["high_freq_factor"] <= out["low_freq_factor"]:
        raise ValueError("rope_scaling['high_freq_factor'] must exceed low_freq_factor, got "
                         f"{out['high_freq_factor']} <= {out['low_freq_factor']}")
    return out


def rotary_inv_freq(rotary_dim: int, base: float, scaling: dict[str, Any] | None = None,
                    seq_len: int | None = None) -> Float[Tensor, "half"]:  # noqa: F821 (jaxtyping axis)
    """The `rotary_dim // 2` inverse frequencies in float64, scaled as `scaling` says.

    `seq_len` (the call's `max(positions) + 1`) matters only for "dynamic" scaling.

    Example:
        >>> rotary_inv_freq(4, 100.0, {"rope_type": "linear", "factor": 2.0})
        tensor([0.5000, 0.0500], dtype=torch.float64)
    """
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim
    kind = None if scaling is None else scaling["rope_type"]
    if kind == "dynamic" and seq_len is not None \
            and seq_len > scaling["original_max_position_embeddings"]:
        factor, original = scaling["factor"], scaling["original_max_position_embeddings"]
        base = base * (factor * seq_len / original - (factor - 1)) ** (
            rotary_dim / (rotary_dim - 2))
    inv_freq = 1.0 / base ** exponents
    if kind == "linear":
        return inv_freq / scaling["factor"]
    if kind == "llama3":
        factor, old = scaling["factor"], scaling["original_max_position_embeddings"]
        low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
        wavelen = 2 * math.pi / inv_freq
        smooth = (old / wavelen - low) / (high - low)
        band = (1 - smooth) * inv_freq / factor + smooth * inv_freq
        inv_freq = torch.where(wavelen > old / low, inv_freq / factor,
                               torch.where(wavelen < old / high, inv_freq, band))
    return inv_freq


class Rotary(nn.Module):
    """Applies RoPE to `[batch, pos, head_index, d_head]` tensors at given integer positions.

    Example:
        >>> rope = Rotary(d_head=8, rotary_dim=8, n_ctx=16)
        >>> x = torch.randn(1, 4, 2, 8)
        >>> rope(x, torch.arange(4)[None]).shape
        torch.Size([1, 4, 2, 8])
    """

    def __init__(self, d_head: int, rotary_dim: int, n_ctx: int, base: float = 10000.0,
                 adjacent_pairs: bool = False, scaling: dict[str, Any] | None = None):
        super().__init__()
        self.rotary_dim = rotary_dim
        self.adjacent_pairs = adjacent_pairs
        self.base = base
        self.scaling = normalize_rope_scaling(scaling)
        if self.scaling is not None and self.scaling["rope_type"] == "dynamic" and rotary_dim <= 2:
            raise ValueError(f"dynamic rope_scaling needs rotary_dim > 2, got {rotary_dim}")
        # Kept in float64 and cast at use, so fp16 models still rotate with exact angles.
        cos, sin = self._table(torch.arange(n_ctx, dtype=torch.float64),
                               rotary_inv_freq(rotary_dim, base, self.scaling))
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def _table(self, positions: Tensor, inv_freq: Tensor) -> tuple[Tensor, Tensor]:
        angles = positions[..., None] * inv_freq.to(positions.device)
        if self.adjacent_pairs:
            angles = angles.repeat_interleave(2, dim=-1)
        else:
            angles = torch.cat([angles, angles], dim=-1)
        return angles.cos(), angles.sin()

    def _rotate(self, x: Tensor) -> Tensor:
        if self.adjacent_pairs:
            x1, x2 = x[..., 0::2], x[..., 1::2]
            return torch.stack([-x2, x1], dim=-1).flatten(-2)
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat([-x2, x1], dim=-1)

    def forward(
        self, x: Float[Tensor, "batch pos head_index d_head"], positions: Int[Tensor, "batch pos"],
        top: int | None = None,
    ) -> Float[Tensor, "batch pos head_index d_head"]:
        """Rotate `x` at `positions`; `top`, when the caller knows it, is `positions.max()`
        (saves a device sync, so a compiled training step stays one graph)."""
        if top is None or (self.scaling is not None and self.scaling["rope_type"] == "dynamic"):
            top = int(positions.max())
        if top >= self.cos.shape[0]:
            raise ValueError(f"rotary position {top} exceeds the table of "
                             f"{self.cos.shape[0]} positions (n_ctx)")
        rd = self.rotary_dim
        scaling = self.scaling
        if (scaling is not None and scaling["rope_type"] == "dynamic"
                and top + 1 > scaling["original_max_position_embeddings"]):
            # Dynamic NTK: this call's length sets the frequencies of all its positions.
            inv_freq = rotary_inv_freq(rd, self.base, scaling, seq_len=top + 1)
            cos, sin = self._table(positions.to(torch.float64), inv_freq)
            cos, sin = cos[:, :, None, :].to(x.dtype), sin[:, :, None, :].to(x.dtype)
        else:
            cos = self.cos[positions][:, :, None, :].to(x.dtype)
            sin = self.sin[positions][:, :, None, :].to(x.dtype)
        x_rot, x_pass = x[..., :rd], x[..., rd:]
        x_rot = x_rot * cos + self._rotate(x_rot) * sin
        return torch.cat([x_rot, x_pass], dim=-1)
