"""Honest figures of attention maps: a colour bar on every map, a diverging zero-centred scale for
signed stages, a sequential one for distributions, ranges that fit the values, numbers in cells
where they fit, axis titles, and token labels thinned so that 512 positions stay readable.

The scale comes from the stage catalogue (`Stage.softmax`, `Stage.row_stochastic`) and the values:

    row-stochastic map                 -> sequential, 0 .. max
    pre- or post-softmax, otherwise    -> diverging around 0, -m .. m with m = max |value|
    neither (CoPE gates, positions)    -> sequential min(0, min) .. max, diverging if signed

Example:
    >>> fig = map_figure(maps[0, 3], stage, labels, title="L1H3 pattern")   # doctest: +SKIP
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots
from torch import Tensor

from hooked_models.attention import Stage

SEQUENTIAL = "Blues"
DIVERGING = "RdBu_r"
MAX_TEXT_CELLS = 20      # numbers drawn in the cells up to 20 x 20: beyond, they overlap
MAX_TICKS = 48           # token labels per axis; longer inputs label every n-th token


@dataclass(frozen=True)
class MapScale:
    """A heatmap colour scale: `kind` is "sequential" or "diverging" (then zmid = 0)."""

    kind: str
    zmin: float
    zmax: float

    @property
    def colorscale(self) -> str:
        return DIVERGING if self.kind == "diverging" else SEQUENTIAL

    @property
    def zmid(self) -> float | None:
        return 0.0 if self.kind == "diverging" else None

    def heatmap_args(self) -> dict:
        return dict(colorscale=self.colorscale, zmin=self.zmin, zmax=self.zmax, zmid=self.zmid)


def map_scale(stage: Stage, values: Tensor) -> MapScale:
    """The colour scale for `values` (any shape; -inf / NaN ignored) of `stage`."""
    finite = values[torch.isfinite(values)].double()
    lo = float(finite.min()) if finite.numel() else 0.0
    hi = float(finite.max()) if finite.numel() else 1.0
    signed_stage = not stage.row_stochastic and stage.softmax in ("pre", "post")
    if signed_stage or lo < 0:
        m = max(abs(lo), abs(hi)) or 1.0
        return MapScale("diverging", -m, m)
    top = hi if hi > 0 else 1.0
    return MapScale("sequential", 0.0, top)


def _blank_masked(z: Tensor):
    """NaN where masked (-inf) or not finite: plotly leaves those cells empty."""
    z = z.double()
    # float32 halves the figure's payload (plotly sends arrays as typed binary) and still
    # carries 7 significant digits, more than any colour or hover label shows.
    return torch.where(torch.isfinite(z), z, torch.full_like(z, float("nan"))).float().numpy()


def token_ticks(labels: list[str], max_ticks: int = MAX_TICKS) -> dict:
    """Axis settings showing every label up to `max_ticks`, else every n-th one (and smaller
    font), so that long inputs keep legible, non-overlapping labels; hover keeps them all."""
    n = len(labels)
    step = max(1, math.ceil(n / max_ticks))
    shown = labels[::step]
    return dict(tickmode="array", tickvals=shown, ticktext=shown,
                tickfont=dict(size=11 if step == 1 and n <= 24 else 9))


def stage_caption(stage: Stage) -> str:
    flags = {"pre": "pre-softmax", "post": "post-softmax", "neither": "not a softmax input/output"}
    rows = ", rows sum to 1" if stage.row_stochastic else ""
    return f"hook_{stage.name} ({flags.get(stage.softmax, stage.softmax)}{rows})"


def map_figure(map2d: Tensor, stage: Stage, labels: list[str], title: str = "",
               scale: MapScale | None = None, height: int = 520) -> go.Figure:
    """One `[query key]` map with its colour bar, axis titles and token labels.

    `labels` name the positions (unique, e.g. "3:c"); numbers are drawn in cells for inputs up to
    `MAX_TEXT_CELLS` tokens. `scale` defaults to `map_scale(stage, map2d)`.
    """
    q, k = map2d.shape
    if len(labels) != q or q != k:
        raise ValueError(f"labels has {len(labels)} entries for a {q} x {k} map; need {q} x {q}")
    scale = scale or map_scale(stage, map2d)
    text = dict(texttemplate="%{z:.2f}", textfont=dict(size=9)) if q <= MAX_TEXT_CELLS else {}
    fig = go.Figure(go.Heatmap(
        z=_blank_masked(map2d), x=labels, y=labels, **scale.heatmap_args(), **text,
        colorbar=dict(title=dict(text=stage.name, side="right"), thickness=14),
        hovertemplate="query %{y}<br>key %{x}<br>%{z:.4f}<extra>" + stage.name + "</extra>"))
    fig.update_xaxes(title="key", **token_ticks(labels), tickangle=-90)
    fig.update_yaxes(title="query", autorange="reversed", **token_ticks(labels))
    fig.update_layout(title=dict(text=title or stage_caption(stage), font=dict(size=13)),
                      height=height, margin=dict(l=60, r=20, t=50, b=60))
    return fig


def head_grid_figure(grid: list[Tensor | None], stage: Stage, title: str = "",
                     cell_px: int = 110) -> go.Figure:
    """Thumbnails of every head: rows = layers, columns = heads, one shared colour bar.

    `grid[layer]` is `[head q k]` (already downsampled) or None where the layer lacks the stage.
    Each trace is named "L{layer}H{head}" so that a click names the head it landed on.
    """
    present = [g for g in grid if g is not None]
    if not present:
        raise ValueError(f"no layer has stage {stage.name!r}")
    n_layers, n_heads = len(grid), present[0].shape[0]
    scale = map_scale(stage, torch.stack(present))
    fig = make_subplots(rows=n_layers, cols=n_heads, horizontal_spacing=0.012,
                        vertical_spacing=0.03, row_titles=[f"L{x}" for x in range(n_layers)],
                        column_titles=[f"H{h}" for h in range(n_heads)])
    for layer, maps in enumerate(grid):
        for head in range(n_heads):
            z = None if maps is None else _blank_masked(maps[head])
            fig.add_trace(go.Heatmap(
                z=z, coloraxis="coloraxis", name=f"L{layer}H{head}",
                hovertemplate=f"L{layer}H{head}<br>q %{{y}} k %{{x}}<br>%{{z:.3f}}<extra></extra>"),
                row=layer + 1, col=head + 1)
    fig.update_xaxes(showticklabels=False)
    fig.update_yaxes(showticklabels=False, autorange="reversed")
    fig.update_layout(
        coloraxis=dict(colorscale=scale.colorscale, cmin=scale.zmin, cmax=scale.zmax,
                       cmid=scale.zmid, colorbar=dict(title=dict(text=stage.name), thickness=12)),
        title=dict(text=title or f"every head: {stage_caption(stage)} (click to zoom)",
                   font=dict(size=13)),
        height=60 + cell_px * n_layers, width=90 + cell_px * n_heads,
        margin=dict(l=30, r=30, t=60, b=10))
    return fig


def row_column_figure(row: Tensor, column: Tensor, labels: list[str], query: int, key: int,
                      stage: Stage) -> go.Figure:
    """Bars of query `query`'s row over keys and key `key`'s column over queries."""
    fig = make_subplots(rows=2, cols=1, vertical_spacing=0.3, subplot_titles=[
        f"query {labels[query]} attends to (row)", f"key {labels[key]} is read by (column)"])
    for i, values in enumerate((row, column)):
        fig.add_trace(go.Bar(x=labels, y=_blank_masked(values), showlegend=False,
                             hovertemplate="%{x}: %{y:.4f}<extra></extra>"), row=i + 1, col=1)
    fig.update_xaxes(**token_ticks(labels), tickangle=-90)
    fig.update_xaxes(title="key", row=1, col=1)
    fig.update_xaxes(title="query", row=2, col=1)
    fig.update_yaxes(title=stage.name)
    fig.update_layout(height=460, margin=dict(l=60, r=20, t=40, b=60))
    return fig
