"""`InfiniOptions`: the options of the "infini" attention, with the official code's names as aliases
(validated on construction: a bad value raises ValueError naming it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from attnlens.kernels.infini import reference as mem

PER_TOKEN = "batch query_pos head_index d_head"


@dataclass
class InfiniOptions:
    """Options of the "infini" variant.

    Attributes:
        segment_len: tokens per segment N (paper: 2048; the HF reproduction used 64).
        update: "linear" (Eq. 8) or "delta" (linear + delta, Eq. 9).
        gate_init: initial beta of every head; sigmoid(0) = 0.5. Avoid large |beta|: the gate's
            gradient vanishes (Beomi's Gemma port initialises -100 and the gate cannot learn).
        detach_every: 0 = gradients through the memory across all segments (paper); n > 0 =
            truncated BPTT, (M, z) detached after every n-th segment (n = 1: W_K and W_V get no
            gradient through the memory at all).
    """

    segment_len: int = 64
    update: str = "linear"
    gate_init: float = 0.0
    detach_every: int = 0

    def validate(self, cfg) -> None:
        for name, low in (("segment_len", 1), ("detach_every", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"infini {name} must be an int >= {low}, got {value!r}")
        if self.update not in mem.UPDATE_RULES:
            raise ValueError(f"infini update={self.update!r}; "
                             f"choose one of {list(mem.UPDATE_RULES)}")
        if not isinstance(self.gate_init, (int, float)) or not math.isfinite(self.gate_init):
            raise ValueError(f"infini gate_init must be a finite number, got {self.gate_init!r}")
