"""Dynamically Composable Multi-Head Attention (Xiao et al. 2024): Compose across heads.

Files: `layer.py`, `ops.py`, `options.py`.
Importing this package registers the variant "dcmha" (`layer.py`).
"""

from attnlens.hooked_models.attention.dcmha.layer import DCMHAttention
from attnlens.hooked_models.attention.dcmha.options import DCMHAOptions

__all__ = ["DCMHAOptions", "DCMHAttention"]
