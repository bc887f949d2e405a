"""Multi-Token Attention (Golovneva et al. 2025): key-query convolution, head mixing, group norm.

Files: `block_conv.py`, `layer.py`, `ops.py`, `options.py`.
Importing this package registers the variant "mta" (`layer.py`).
"""

from attnlens.hooked_models.attention.mta.layer import MultiTokenAttention
from attnlens.hooked_models.attention.mta.options import MTAOptions

__all__ = ["MTAOptions", "MultiTokenAttention"]
