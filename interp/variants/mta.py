"""Multi-Token Attention views: each head's key-query kernel, classified, and its head mixing.

Kernel layout (`attnlens.hooked_models.attention.mta.ops`): `[head_index 1 c_q c_k]`; tap `[a, b]`
multiplies the map at query `i - (c_q - 1) + a`, key `j - left + b`, so row `c_q - 1` is the
current query and column `left` (the centre for `pad_key="both"`) the same key. Classes, from the
share of the kernel's energy (sum of squared taps) on tap groups:

- "identity": the single tap (current query, same key) holds >= 80%: plain attention;
- "diagonal" (sequence matching): the diagonal ending at that tap (query i - d with key j - d)
  holds >= 80% with >= 20% off the centre: the head scores a key by how well the keys before it
  matched the queries before the current one (paper Sec. 2, "find the block");
- "induction" (the previous-key diagonal): the diagonal ending at (current query, previous
  key), query i - d with key j - 1 - d, holds >= 80% and its taps sum positive (a negative
  one avoids such keys and falls to "edge" or "mixed"): the head scores key j by how well the
  key before it (and the keys before that) matched the current query (and the queries before
  it), so it attends to the token after an earlier occurrence of the current one: an induction
  head in one layer, the previous-token shift done by the kernel instead of an earlier head;
- "priming": the same-key column (earlier queries, same key) holds >= 80% with >= 20% above the
  current query: a key is favoured if earlier queries attended to it;
- "edge": taps of both signs that nearly cancel (|sum| <= 30% of sum |tap|, negative share >=
  20%): a difference filter over neighbouring keys or queries;
- "mixed": anything else.

Kernels are read from the layers that have them (`mta_kernel` before the softmax,
`mta_kernel_after_sm` after it); the head-mixing matrices come from the generic `head_mixing()`
seam (`attnlens.interp.circuits.composed.mixing_pairs`).

Example:
    >>> kernel_table(model)[["head_label", "phase", "class"]]      # doctest: +SKIP
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import pandas as pd
import torch
from torch import Tensor

from attnlens.hooked_models.attention.mta.ops import key_padding
from attnlens.interp._common import (
    check_attention_weights,
    check_finite,
    check_fraction,
    head_label,
)

KERNEL_ATTRS = {"pre": "mta_kernel", "post": "mta_kernel_after_sm"}


def key_query_kernels(model) -> dict[tuple[int, str], Tensor]:
    """`{(layer, phase): [head_index c_q c_k]}` for every layer and phase with a kernel."""
    check_attention_weights(model)
    out = {}
    for layer, block in enumerate(model.blocks):
        for phase, attr in KERNEL_ATTRS.items():
            kernel = getattr(block.attn, attr, None)
            if kernel is not None:
                out[(layer, phase)] = kernel.detach()[:, 0]
    return out


def kernel_centre(model, layer: int, c_k: int) -> int:
    """Column of the same key (the `pad_key` padding on the left)."""
    pad_key = getattr(model.blocks[layer].attn.opts, "pad_key", "both")
    return key_padding(c_k, pad_key)[0]


def kernel_features(kernel: Tensor, centre: int) -> dict[str, float]:
    """Energy shares of one `[c_q c_k]` kernel (see module docstring) and its sign balance."""
    k = check_finite("kernel", kernel).double()
    c_q, c_k = k.shape
    energy = k.pow(2)
    total = float(energy.sum()) or 1e-300
    cur = c_q - 1
    def diagonal(end: int, of: Tensor = energy) -> float:   # sum on the diagonal to (cur, end)
        return sum(float(of[a, end - (cur - a)]) for a in range(c_q)
                   if 0 <= end - (cur - a) < c_k)

    diag = diagonal(centre)
    column = float(energy[:, centre].sum())
    absolute = float(k.abs().sum()) or 1e-300
    previous = diagonal(centre - 1, k) if centre >= 1 else 0.0   # signed previous-key taps
    return {"identity_share": float(energy[cur, centre]) / total,
            "diagonal_share": diag / total,
            "induction_share": (diagonal(centre - 1) if centre >= 1 else 0.0) / total,
            # +1 when the previous-key diagonal's taps sum positive (attend), -1 negative (avoid)
            "induction_sign": float(math.copysign(1.0, previous)) if previous != 0 else 0.0,
            "priming_share": column / total,
            "balance": abs(float(k.sum())) / absolute,
            "negative_share": float(k.clamp(max=0).abs().sum()) / absolute}


def classify_kernel(kernel: Tensor, centre: int, share: float = 0.8) -> str:
    """One of "identity", "diagonal", "induction", "priming", "edge", "mixed".

    Example:
        >>> k = torch.zeros(3, 5); k[2, 2] = 1.0
        >>> classify_kernel(k, centre=2)
        'identity'
    """
    check_fraction("share", share, open_low=True)
    f = kernel_features(kernel, centre)
    if f["identity_share"] >= share:
        return "identity"
    if f["diagonal_share"] >= share and f["diagonal_share"] - f["identity_share"] >= 0.2:
        return "diagonal"
    if f["induction_share"] >= share and f["induction_sign"] > 0:
        return "induction"
    if f["priming_share"] >= share and f["priming_share"] - f["identity_share"] >= 0.2:
        return "priming"
    if f["balance"] <= 0.3 and f["negative_share"] >= 0.2:
        return "edge"
    return "mixed"


def kernel_table(model, share: float = 0.8) -> pd.DataFrame:
    """One row per (layer, phase, head) with a key-query kernel: its class and energy shares.

    Returns columns `head_label`, `layer`, `head`, `phase` ("pre"/"post" softmax), `class`,
    `identity_share`, `diagonal_share`, `induction_share`, `priming_share`, `balance`,
    `negative_share`; empty
    for a model without key-query kernels.
    """
    check_fraction("share", share, open_low=True)
    rows = []
    for (layer, phase), kernels in key_query_kernels(model).items():
        centre = kernel_centre(model, layer, kernels.shape[-1])
        for h, k in enumerate(kernels):
            rows.append({"head_label": head_label(layer, h), "layer": layer, "head": h,
                         "phase": phase, "class": classify_kernel(k, centre, share),
                         **kernel_features(k, centre)})
    return pd.DataFrame(rows, columns=["head_label", "layer", "head", "phase", "class",
                                       "identity_share", "diagonal_share", "induction_share",
                                       "induction_sign", "priming_share", "balance",
                                       "negative_share"])


@contextmanager
def plain_kernel(model, layer: int, head: int, phase: str = "pre"):
    """Within the block, head `head` of `layer` has the identity key-query kernel at `phase`
    ("pre"/"post" softmax): that head's convolution is switched off (plain attention for its
    map), every other weight unchanged; the trained kernel is restored on exit.

    Example:
        >>> with plain_kernel(model, 0, 3):                       # doctest: +SKIP
        ...     loss = model(tokens, return_type="loss")
    """
    if phase not in KERNEL_ATTRS:
        raise ValueError(f"phase must be one of {list(KERNEL_ATTRS)}, got {phase!r}")
    weight = (getattr(model.blocks[layer].attn, KERNEL_ATTRS[phase], None)
              if isinstance(layer, int) and 0 <= layer < len(model.blocks) else None)
    if weight is None:
        raise ValueError(f"layer {layer} has no {phase}-softmax key-query kernel")
    if not 0 <= head < weight.shape[0]:
        raise ValueError(f"head {head} out of range [0, {weight.shape[0]})")
    saved = weight.detach().clone()
    c_q, c_k = weight.shape[-2:]
    try:
        with torch.no_grad():
            weight[head].zero_()
            weight[head, 0, c_q - 1, kernel_centre(model, layer, c_k)] = 1.0
        yield model
    finally:
        with torch.no_grad():
            weight.copy_(saved)
