"""Standard multi-head attention (Vaswani et al. 2017), the baseline every variant reduces to.

Files: `layer.py`.
Importing this package registers the variant "mha" (`layer.py`).
"""

from attnlens.hooked_models.attention.mha.layer import MultiHeadAttention

__all__ = ["MultiHeadAttention"]
