"""The one colour module of every attnlens figure (explorer, compare, variants, outputs,
circuits, notebooks, sweeps).

Rules, the same everywhere:

- Scales are explicit lists of colours, never plotly's named scales: plotly.js reads "Blues" the
  other way round from plotly.py (0 dark, the maximum near white) and does not know "RdBu_r" at
  all (it falls back to RdBu, whose zero is grey), so a named scale draws differently in the
  browser and in a notebook.
- Zero is white on every scale. A one-sided scale (`SEQUENTIAL`) runs from white at 0 to dark
  blue at its maximum; a signed scale (`DIVERGING`) is zero-centred, blue below, white at 0,
  red above, with a symmetric range -m .. m.
- Masked cells (causal mask, -inf, NaN) are not zero: heatmaps leave them empty and the plot
  background behind them is `MASKED` light grey, which the figure says in a note
  (`masked_note`).

Example:
    >>> scale_args([0.0, 0.5])["colorscale"] == SEQUENTIAL
    True
    >>> scale_args([-2.0, 1.0]) == dict(colorscale=DIVERGING, zmin=-2.0, zmax=2.0, zmid=0.0)
    True
"""

from __future__ import annotations

import numpy as np

# ColorBrewer Blues (9 classes) with its lightest colour replaced by pure white at 0.
SEQUENTIAL: list[list] = [
    [0.0, "#ffffff"], [0.125, "#deebf7"], [0.25, "#c6dbef"], [0.375, "#9ecae1"],
    [0.5, "#6baed6"], [0.625, "#4292c6"], [0.75, "#2171b5"], [0.875, "#08519c"],
    [1.0, "#08306b"]]
# ColorBrewer RdBu (11 classes), negative blue -> white at the centre -> positive red.
DIVERGING: list[list] = [
    [0.0, "#053061"], [0.1, "#2166ac"], [0.2, "#4393c3"], [0.3, "#92c5de"],
    [0.4, "#d1e5f0"], [0.5, "#ffffff"], [0.6, "#fddbc7"], [0.7, "#f4a582"],
    [0.8, "#d6604d"], [0.9, "#b2182b"], [1.0, "#67001f"]]
MASKED = "#c8c8c8"          # the background showing through masked (empty) cells
MASKED_TEXT = "grey cells: masked (no value), white: 0"
# Discrete colours: one per model variant, and one per class of head (gates, kernels).
VARIANT_COLOURS = {"mha": "#1f77b4", "mta": "#ff7f0e", "cope": "#2ca02c", "dcmha": "#d62728",
                   "infini": "#9467bd"}
QUALITATIVE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
               "#7f7f7f", "#bcbd22", "#17becf"]
CLASS_COLOURS = {"memory specialist": "#d62728", "local specialist": "#1f77b4",
                 "high (mean >= 0.8)": "#d62728", "low (mean <= 0.2)": "#1f77b4",
                 "mixer": "#2ca02c", "intermediate": "#7f7f7f",
                 "excite": "#d62728", "inhibit": "#1f77b4", "neutral": "#7f7f7f",
                 "identity": "#7f7f7f", "diagonal": "#9467bd", "priming": "#ff7f0e",
                 "induction": "#e377c2",
                 "edge": "#17becf", "mixed": "#8c564b"}


def colour(i: int) -> str:
    """The i-th qualitative colour (cycling)."""
    return QUALITATIVE[i % len(QUALITATIVE)]


def colour_at(scale: list[list], t: float) -> str:
    """The colour of `scale` (a list of [position, "#rrggbb"]) at `t` in [0, 1] (clipped),
    interpolated linearly in RGB: for HTML views drawn with the figures' scales."""
    t = min(1.0, max(0.0, float(t))) if np.isfinite(t) else 0.0
    for (a, ca), (b, cb) in zip(scale, scale[1:], strict=False):
        if t <= b:
            f = 0.0 if b == a else (t - a) / (b - a)
            rgb = [round(int(ca[i:i + 2], 16) * (1 - f) + int(cb[i:i + 2], 16) * f)
                   for i in (1, 3, 5)]
            return "#" + "".join(f"{c:02x}" for c in rgb)
    return scale[-1][1]


def value_colour(value: float, top: float, signed: bool = False) -> str:
    """The colour of `value` on the sequential scale 0 .. `top`, or on the diverging one
    -`top` .. `top` when `signed`; NaN (masked) is `MASKED`."""
    if not np.isfinite(value):
        return MASKED
    top = top if top > 0 else 1.0
    if signed:
        return colour_at(DIVERGING, 0.5 + 0.5 * value / top)
    return colour_at(SEQUENTIAL, value / top)


def _finite(values) -> np.ndarray:
    a = np.asarray(values, dtype=float).ravel()
    return a[np.isfinite(a)]


def scale_args(values=None, signed: bool | None = None, zmax: float | None = None,
               zmin: float | None = None) -> dict:
    """Heatmap arguments (`colorscale`, `zmin`, `zmax`, and `zmid` when signed) for `values`.

    `signed`: True forces the zero-centred diverging scale, False the one-sided one; None
    (default) picks diverging when any finite value is negative. `zmax` (and `zmin` for a
    one-sided scale) fix the range instead of fitting it to the values.
    """
    a = _finite(values if values is not None else [])
    lo = float(a.min()) if a.size else 0.0
    hi = float(a.max()) if a.size else 1.0
    if signed is None:
        signed = lo < 0
    if signed:
        m = zmax if zmax is not None else max(abs(lo), abs(hi))
        m = m if m and np.isfinite(m) and m > 0 else 1.0
        return dict(colorscale=DIVERGING, zmin=-m, zmax=m, zmid=0.0)
    top = zmax if zmax is not None else (hi if hi > 0 else 1.0)
    return dict(colorscale=SEQUENTIAL, zmin=0.0 if zmin is None else zmin, zmax=top)


def coloraxis_args(values=None, signed: bool | None = None, zmax: float | None = None) -> dict:
    """`scale_args` for a layout `coloraxis` (cmin / cmax / cmid)."""
    args = scale_args(values, signed, zmax)
    out = dict(colorscale=args["colorscale"], cmin=args["zmin"], cmax=args["zmax"])
    if "zmid" in args:
        out["cmid"] = args["zmid"]
    return out


def colorbar_title(text: str, masked: bool = True, what: str = "masked") -> dict:
    """A colour bar title that, with `masked`, says how masked cells look (the legend of the
    grey background; `what` names what grey stands for)."""
    note = f"<br><span style='font-size:9px'>grey: {what}</span>" if masked else ""
    return dict(text=f"{text}{note}", side="right")


def masked_note(y: float = -0.02) -> dict:
    """A small layout annotation saying how masked cells look (below the plot, at the right)."""
    return dict(text=f"<span style='color:{MASKED}'>&#9632;</span> {MASKED_TEXT}",
                showarrow=False, xref="paper", yref="paper", x=1.0, y=y, xanchor="right",
                yanchor="top", font=dict(size=10, color="#555"))


def masked_layout(layout: dict, note: bool = True, y: float = -0.02) -> dict:
    """`layout` (a dict) with the masked background and, with `note`, the note added."""
    layout = dict(layout)
    layout["plot_bgcolor"] = MASKED
    if note:
        layout["annotations"] = [*layout.get("annotations", []), masked_note(y)]
    return layout


__all__ = ["CLASS_COLOURS", "DIVERGING", "MASKED", "MASKED_TEXT", "QUALITATIVE", "SEQUENTIAL",
           "VARIANT_COLOURS", "coloraxis_args", "colorbar_title", "colour", "masked_layout",
           "colour_at", "masked_note", "scale_args", "value_colour"]
