"""Contextual Position Encoding (Golovneva et al. 2024): gated, counted positions.

Files: `layer.py`, `ops.py`, `options.py`.
Importing this package registers the variant "cope" (`layer.py`).
"""

from attnlens.hooked_models.attention.cope.layer import CoPEAttention
from attnlens.hooked_models.attention.cope.options import CoPEOptions

__all__ = ["CoPEAttention", "CoPEOptions"]
