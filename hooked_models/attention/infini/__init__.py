"""Infini-attention (Munkhdalai et al. 2024): local attention plus a compressive memory.

Files: `layer.py`, `options.py`.
Importing this package registers the variant "infini" (`layer.py`).
"""

from attnlens.hooked_models.attention.infini.layer import InfiniAttention
from attnlens.hooked_models.attention.infini.options import InfiniOptions

__all__ = ["InfiniAttention", "InfiniOptions"]
