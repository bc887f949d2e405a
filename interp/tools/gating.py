"""Gating specialisation: per-head gate values of any variant, found through the catalogue.

A "per-head scalar stage" is a catalogue stage whose shape has a `head_index` axis and otherwise
only batch / position / group axes (no key axis, no feature axis): Infini-attention's memory gate
`gate [batch head_index]`, MTA's output gate `gate [batch pos head_index]` (or, with
gate_1d=False, `[batch pos head_index d_head]`: dimensions count as samples), DCMHA's dynamic
gates `{pre,post}_{q,k}dd [batch pos group head_index]`. `gate_values` summarises every such
stage per head and classifies it:

- gates in [0, 1] (sigmoids): "high" (mean >= 0.8), "low" (<= 0.2), "mixer" (|mean - 0.5| <=
  0.15), else "intermediate" (Infini-attention paper, Fig. 3: specialists near 0 or 1, mixers
  near 0.5; for Infini "high" = memory specialist, "low" = local specialist);
- signed gates (tanh; DCMHA's self-gating `A' = A (1 + dd)`): "excite" (mean >= 0.25),
  "inhibit" (<= -0.25), else "neutral".

Which heads each head borrows from under dynamic composition is
`attnlens.interp.circuits.composed.borrowing_table`.

Example:
    >>> table = gate_values(model, tokens)                       # doctest: +SKIP
    >>> table[table.stage == "gate"][["head_label", "mean", "class"]]
"""

from __future__ import annotations

import math

import pandas as pd
from torch import Tensor

from attnlens.interp._common import as_tokens, check_fraction, head_label, run_cache

SCALAR_AXES = {"batch", "pos", "query_pos", "segment", "group", "head_index"}
# A gate stage may also carry a feature axis (MTA's per-dimension gate, gate_1d=False): its
# values are then more samples of the head's gate, not a stage to skip.
GATE_FEATURE_AXES = {"d_head"}


def head_scalar_stages(model, layer: int) -> list:
    """The catalogue stages of `layer` that hold one value per head (and batch/position)."""
    out = []
    for s in model.stages(layer):
        dims = s.shape.split()
        allowed = SCALAR_AXES | GATE_FEATURE_AXES if s.name == "gate" else SCALAR_AXES
        if "head_index" in dims and set(dims) <= allowed:
            out.append(s)
    return out


def _per_head(values: Tensor, dims: list[str]) -> Tensor:
    """`[head, n]` samples per head from a tensor with axes `dims` (groups folded into heads)."""
    if "group" in dims:
        g, h = dims.index("group"), dims.index("head_index")
        values = values.movedim((g, h), (-2, -1)).flatten(-2)
    else:
        values = values.movedim(dims.index("head_index"), -1)
    return values.reshape(-1, values.shape[-1]).T


def classify_gate(mean: float, signed: bool, low: float = 0.2, high: float = 0.8,
                  band: float = 0.15, signed_threshold: float = 0.25) -> str:
    """Class of a head from its mean gate (see module docstring).

    Example:
        >>> classify_gate(0.93, signed=False), classify_gate(0.52, signed=False)
        ('high', 'mixer')
    """
    _check_thresholds(low, high, band, signed_threshold)
    if not math.isfinite(mean):   # NaN fails every comparison and would read "intermediate"
        raise ValueError(f"mean gate {mean!r} is not finite; it cannot be classified")
    if signed:
        if mean >= signed_threshold:
            return "excite"
        return "inhibit" if mean <= -signed_threshold else "neutral"
    if mean >= high:
        return "high"
    if mean <= low:
        return "low"
    return "mixer" if abs(mean - 0.5) <= band else "intermediate"


def _check_thresholds(low: float, high: float, band: float, signed_threshold: float) -> None:
    check_fraction("low", low)
    check_fraction("high", high)
    if low > high:
        raise ValueError(f"low={low!r} must not exceed high={high!r}")
    check_fraction("band", band, high=0.5)
    check_fraction("signed_threshold", signed_threshold, open_low=True)


def gate_values(model, tokens, **thresholds) -> pd.DataFrame:
    """Per-head statistics of every per-head scalar stage of every layer on `tokens`.

    Returns a DataFrame with one row per (layer, stage, head): `head_label`, `layer`, `head`,
    `stage`, `mean`, `std`, `min`, `max`, `frac_low` (< 0.1), `frac_high` (> 0.9), `signed`
    (values < 0 occur) and `class` (`classify_gate`; `thresholds` are passed on). Empty (with
    these columns) for a model without gates (MHA, CoPE).
    """
    classify_gate(0.5, False, **thresholds)   # bad thresholds fail before the forward pass
    tokens = as_tokens(model, tokens)
    wanted = {}
    for layer in range(model.cfg.n_layers):
        for s in head_scalar_stages(model, layer):
            wanted[model.stage_hook_name(layer, s)] = (layer, s)
    columns = ["head_label", "layer", "head", "stage", "mean", "std", "min", "max", "frac_low",
               "frac_high", "signed", "class"]
    if not wanted:
        return pd.DataFrame(columns=columns)
    store = run_cache(model, tokens, list(wanted))
    rows = []
    for name, (layer, stage) in wanted.items():
        samples = _per_head(store[name].double(), stage.shape.split())
        signed = bool((samples < 0).any())
        for h in range(samples.shape[0]):
            x = samples[h]
            mean = float(x.mean())
            rows.append({"head_label": head_label(layer, h), "layer": layer, "head": h,
                         "stage": stage.name, "mean": mean,
                         "std": float(x.std()) if x.numel() > 1 else 0.0,
                         "min": float(x.min()), "max": float(x.max()),
                         "frac_low": float((x < 0.1).double().mean()),
                         "frac_high": float((x > 0.9).double().mean()), "signed": signed,
                         "class": classify_gate(mean, signed, **thresholds)})
    return pd.DataFrame(rows, columns=columns)
