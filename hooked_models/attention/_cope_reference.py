"""CoPE's plain-torch reference, which lives in `kernels.cope.naive` (the spec of the fused
kernels and of the "cope" layer); re-exported here for the layer and its tests."""

from kernels.cope.naive import DEFAULT_SCALING, SCALINGS, cope_reference, relative_logits_reference

__all__ = ["DEFAULT_SCALING", "SCALINGS", "cope_reference", "relative_logits_reference"]
