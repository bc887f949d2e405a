"""Honest figures of attention maps: a colour bar on every map, a diverging zero-centred scale for
signed stages, a sequential one for distributions, ranges that fit the values, numbers in cells
where they fit, axis titles, and token labels thinned so that 512 positions stay readable.

The scale comes from the stage catalogue (`Stage.softmax`, `Stage.row_stochastic`) and the values:

    row-stochastic map                 -> sequential, 0 .. max
    pre- or post-softmax, otherwise    -> diverging around 0, -m .. m with m = max |value|
    neither (CoPE gates, positions)    -> sequential min(0, min) .. max, diverging if signed

The dashboard's hot paths use the plain-dict forms (`map_figure_dict`, `head_mosaic_figure`:
every head as one heatmap of block-mean tiles; `mosaic_head` maps a click back to its head),
whose arrays are plotly's typed float32 `{dtype, bdata, shape}`: no plotly validation, and JSON
at the speed of one string (attnlens/benchmarks/explorer.py).

Example:
    >>> fig = map_figure(maps[0, 3], stage, labels, title="L1H3 pattern")   # doctest: +SKIP
"""

from __future__ import annotations

import base64
import math
import re
from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots
from torch import Tensor

from attnlens.hooked_models.attention import Stage
from attnlens.interp.plots.colors import DIVERGING, MASKED, SEQUENTIAL, colorbar_title
from attnlens.interp.tools.explore import downsample

MIN_MOSAIC_WIDTH = 440  # px: the title of a 2-head model's thumbnails fits
MODEBAR_PX = 26          # the title sits below the modebar's row, never under its buttons
MAX_TEXT_CELLS = 20      # numbers drawn in the cells up to 20 x 20: beyond, they overlap
WINDOW = 64              # a longer map opens on a window of this many queries and keys
MAX_TICKS = 48           # token labels per axis; longer inputs label every n-th token


@dataclass(frozen=True)
class MapScale:
    """A heatmap colour scale: `kind` is "sequential" or "diverging" (then zmid = 0)."""

    kind: str
    zmin: float
    zmax: float

    @property
    def colorscale(self) -> list:
        return DIVERGING if self.kind == "diverging" else SEQUENTIAL

    @property
    def zmid(self) -> float | None:
        return 0.0 if self.kind == "diverging" else None

    def heatmap_args(self) -> dict:
        args = dict(colorscale=self.colorscale, zmin=self.zmin, zmax=self.zmax, zmid=self.zmid)
        return {k: v for k, v in args.items() if v is not None}


def _finite_or_nan(values: Tensor) -> np.ndarray:
    """`values` as a numpy array of its own float dtype, NaN where not finite (masked)."""
    v = values.detach().cpu()
    v = v if v.is_floating_point() else v.double()
    return v.masked_fill(~torch.isfinite(v), float("nan")).numpy()


def _scale_of(stage: Stage, a: np.ndarray) -> MapScale:
    """`map_scale` of an array whose masked entries are already NaN (one pass each way)."""
    flat = a.ravel()
    lo = float(np.fmin.reduce(flat)) if flat.size else math.nan     # fmin/fmax skip NaN
    hi = float(np.fmax.reduce(flat)) if flat.size else math.nan
    if math.isnan(lo):                                              # nothing finite
        lo, hi = 0.0, 1.0
    signed_stage = not stage.row_stochastic and stage.softmax in ("pre", "post")
    if signed_stage or lo < 0:
        m = max(abs(lo), abs(hi)) or 1.0
        return MapScale("diverging", -m, m)
    top = hi if hi > 0 else 1.0
    return MapScale("sequential", 0.0, top)


def map_scale(stage: Stage, values: Tensor) -> MapScale:
    """The colour scale for `values` (any shape; -inf / NaN ignored) of `stage`."""
    return _scale_of(stage, _finite_or_nan(values))


def _blank_masked(z: Tensor) -> np.ndarray:
    """NaN where masked (-inf) or not finite: plotly leaves those cells empty.

    float32 halves the figure's payload (plotly sends arrays as typed binary) and still
    carries 7 significant digits, more than any colour or hover label shows."""
    return _finite_or_nan(z.detach().float())


def blank_future(z: np.ndarray) -> np.ndarray:
    """`z` (`[..., q, k]`, a float array, changed in place and returned) with the causal mask's
    cells, keys after the query, set to NaN where they hold exactly 0: a softmax output there is
    masked, not "no attention", and is drawn grey like the -inf of the logits. A non-zero value
    after the query (a variant leaking the future) stays visible."""
    q, k = z.shape[-2:]
    future = np.triu(np.ones((q, k), dtype=bool), 1)
    z[..., future & (z == 0)] = np.nan
    return z


def typed_array(values: Tensor | np.ndarray) -> dict:
    """`values` (1-d or 2-d) as plotly's typed binary array `{dtype, bdata, shape}` of float32,
    NaN where not finite: what plotly itself sends for a numpy array, built without walking
    the figure, so a dict figure holding it is JSON-encoded at the speed of one string.
    A numpy array is taken as already blanked (`_blank_masked`)."""
    z = values if isinstance(values, np.ndarray) else _blank_masked(values)
    data = np.ascontiguousarray(z, np.float32).tobytes()         # no copy when already f4
    return {"dtype": "f4", "bdata": base64.b64encode(data).decode(),
            "shape": ", ".join(str(n) for n in z.shape)}


def token_ticks(labels: list[str], max_ticks: int = MAX_TICKS) -> dict:
    """Axis settings showing every label up to `max_ticks`, else every n-th one (and smaller
    font), so that long inputs keep legible, non-overlapping labels; hover keeps them all."""
    n = len(labels)
    step = max(1, math.ceil(n / max_ticks))
    shown = labels[::step]
    return dict(tickmode="array", tickvals=shown, ticktext=shown,
                tickfont=dict(size=11 if step == 1 and n <= 24 else 9))


def title_below_modebar(text: str, size: int = 13) -> dict:
    """A layout title anchored under the top `MODEBAR_PX` pixels, where plotly draws the
    modebar (the buttons appear on hover at the top right and used to cover long titles)."""
    return dict(text=text, font=dict(size=size), x=0.0, xanchor="left", xref="paper",
                y=1.0, yref="container", yanchor="top", pad=dict(t=MODEBAR_PX, l=4))


def stage_caption(stage: Stage) -> str:
    flags = {"pre": "pre-softmax", "post": "post-softmax", "neither": "not a softmax input/output"}
    rows = ", rows sum to 1" if stage.row_stochastic else ""
    return f"hook_{stage.name} ({flags.get(stage.softmax, stage.softmax)}{rows})"


def window_layout(n: int, window: int = WINDOW, end: int | None = None) -> dict:
    """Layout of a long `[n n]` map that opens on `window` queries and keys (those ending at
    position `end`, default the last): square cells (the y axis is anchored to x), every token
    labelled (legible at this size), dragging pans, double-click shows the whole map."""
    end = n if end is None else max(window, min(n, end))
    lo, hi = end - window - 0.5, end - 0.5
    ticks = dict(tickmode="linear", tick0=0, dtick=1, tickfont=dict(size=9))
    return dict(xaxis=dict(range=[lo, hi], constrain="domain", **ticks),
                yaxis=dict(range=[hi, lo], autorange=False, scaleanchor="x", scaleratio=1,
                           constrain="domain", **ticks),
                dragmode="pan")


def map_figure_dict(map2d: Tensor, stage: Stage, labels: list[str], title: str = "",
                    scale: MapScale | None = None, height: int = 520,
                    window: int | None = None) -> dict:
    """`map_figure` as a plain plotly figure dict (z as a typed float32 array): no plotly
    validation, for the dashboard's hot paths. Same arguments and checks as `map_figure`;
    `window`: a map with more positions opens on the last `window` queries and keys, with
    square cells and every token labelled (`window_layout`), and the user pans."""
    q, k = map2d.shape
    if len(labels) != q or q != k:
        raise ValueError(f"labels has {len(labels)} entries for a {q} x {k} map; need {q} x {q}")
    z = blank_future(_blank_masked(map2d))
    # the scale from the float32 values sent when they are the map's own (min/max exact)
    scale = scale or (_scale_of(stage, z) if map2d.dtype == torch.float32
                      else map_scale(stage, map2d))
    text = dict(texttemplate="%{z:.2f}", textfont=dict(size=9)) if q <= MAX_TEXT_CELLS else {}
    masked = bool(np.isnan(z).any())
    trace = dict(type="heatmap", z=typed_array(z), x=list(labels), y=list(labels),
                 **scale.heatmap_args(), **text,
                 colorbar=dict(title=colorbar_title(stage.name, masked), thickness=14),
                 hovertemplate="query %{y}<br>key %{x}<br>%{z:.4f}<extra>" + stage.name
                 + "</extra>")
    layout = dict(   # square cells: the y axis is anchored to x (a query row is a key column)
        xaxis=dict(title=dict(text="key"), tickangle=-90, constrain="domain",
                   **token_ticks(labels)),
        yaxis=dict(title=dict(text="query"), autorange="reversed", scaleanchor="x",
                   scaleratio=1, constrain="domain", **token_ticks(labels)),
        title=title_below_modebar(title or stage_caption(stage)),
        plot_bgcolor=MASKED, height=height, margin=dict(l=60, r=20, t=MODEBAR_PX + 50, b=60))
    if window is not None and q > window:
        # positions as numbers, so that the range is a window of positions; ticks and hover
        # still name every token
        trace.update(x=list(range(q)), y=list(range(q)),
                     hovertemplate="query %{y}<br>key %{x}<br>%{z:.4f}<extra>" + stage.name
                     + "</extra>")
        win = window_layout(q, window)
        for axis, name in (("xaxis", "key"), ("yaxis", "query")):
            layout[axis] = {**win[axis], "tickmode": "array", "tickvals": list(range(q)),
                            "ticktext": list(labels),
                            "tickangle": -90 if axis == "xaxis" else 0,
                            "title": dict(text=f"{name} (drag to pan; double-click: all)")}
            layout[axis].pop("tick0")
            layout[axis].pop("dtick")
        layout.update(dragmode="pan", height=max(height, 640))
        layout["title"]["text"] += f" ({window} of {q} positions shown)"
    return {"data": [trace], "layout": layout}


def map_figure(map2d: Tensor, stage: Stage, labels: list[str], title: str = "",
               scale: MapScale | None = None, height: int = 520) -> go.Figure:
    """One `[query key]` map with its colour bar, axis titles and token labels.

    `labels` name the positions (unique, e.g. "3:c"); numbers are drawn in cells for inputs up to
    `MAX_TEXT_CELLS` tokens. `scale` defaults to `map_scale(stage, map2d)`.
    """
    fig = map_figure_dict(map2d, stage, labels, title, scale, height)
    fig["data"][0]["z"] = blank_future(_blank_masked(map2d))   # numpy for figure users
    return go.Figure(fig)


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
                       cmid=scale.zmid,
                       colorbar=dict(title=colorbar_title(stage.name), thickness=12)),
        plot_bgcolor=MASKED,
        title=dict(text=title or f"every head: {stage_caption(stage)} (click to zoom)",
                   font=dict(size=13)),
        height=60 + cell_px * n_layers, width=90 + cell_px * n_heads,
        margin=dict(l=30, r=30, t=60, b=10))
    return fig


def _block_labels(prefix: str, n: int, f: int) -> list[str]:
    """'{prefix}{a}' or '{prefix}{a}-{b}' for each block of `f` positions out of `n`."""
    ends = [min(a + f, n) - 1 for a in range(0, n, f)]
    return [f"{prefix}{a}" if a == b else f"{prefix}{a}-{b}"
            for a, b in zip(range(0, n, f), ends, strict=True)]


def head_mosaic_figure(grid: list[Tensor | None], stage: Stage, size: int = 32,
                       title: str = "", cell_px: int = 100,
                       tiles: list[Tensor | None] | None = None) -> dict:
    """Thumbnails of every head as ONE heatmap (a plain figure dict): rows = layers, columns =
    heads, each tile `attnlens.interp.tools.explore.downsample(map, size)` (block means, masked
    pairs ignored), tiles separated by a one-cell NaN gutter, one colour bar (diverging around 0 for
    signed stages). One trace instead of layers x heads subplots is what keeps the update fast.

    `grid[layer]` is the full `[head q k]` map or None where the layer lacks the stage (an
    empty tile). Cells are named on the axes, "L{layer} q{a}-{b}" down and "H{head} k{a}-{b}"
    across (the positions a block averages), so hover says which head and block a value is and
    `mosaic_head` maps a click back to its (layer, head). `tiles`, when given, are
    `downsample(grid[layer], size)` computed beforehand (the dashboard caches them).
    """
    present = [g for g in grid if g is not None]
    if not present:
        raise ValueError(f"no layer has stage {stage.name!r}")
    n_layers, (n_heads, n, _) = len(grid), present[0].shape
    if size < 1:
        raise ValueError(f"size={size!r} must be >= 1")
    f = math.ceil(n / size)
    if tiles is None:
        tiles = [None if g is None else downsample(g, size) for g in grid]
    if [x is None for x in tiles] != [g is None for g in grid]:
        raise ValueError("tiles must be None exactly where grid is None")
    t = next(x for x in tiles if x is not None).shape[-1]
    scale = map_scale(stage, torch.stack([x for x in tiles if x is not None]))
    z = torch.full((n_layers * (t + 1) - 1, n_heads * (t + 1) - 1), float("nan"),
                   dtype=torch.float64)
    for layer, maps in enumerate(tiles):
        if maps is not None:
            rows = z[layer * (t + 1):layer * (t + 1) + t]
            for head in range(n_heads):
                # tiles right of the diagonal hold only keys after their queries: masked
                rows[:, head * (t + 1):head * (t + 1) + t] = torch.from_numpy(
                    blank_future(maps[head].double().numpy().copy()))
    x, y = [], []
    for head in range(n_heads):
        x += _block_labels(f"H{head} k", n, f) + ([f"H{head}|"] if head < n_heads - 1 else [])
    for layer in range(n_layers):
        y += _block_labels(f"L{layer} q", n, f) + ([f"L{layer}|"] if layer < n_layers - 1 else [])
    mid = t // 2
    trace = dict(type="heatmap", z=typed_array(z), x=x, y=y, **scale.heatmap_args(),
                 colorbar=dict(title=colorbar_title(stage.name), thickness=12),
                 name="heads",     # gaps hover too: a click on a masked cell still zooms
                 hovertemplate="%{y}<br>%{x}<br>%{z:.4f}<extra>" + stage.name + "</extra>")
    axis = dict(tickmode="array", showgrid=False, zeroline=False)
    layout = dict(
        xaxis=dict(axis, title=dict(text="head"),
                   tickvals=[x[h * (t + 1) + mid] for h in range(n_heads)],
                   ticktext=[f"H{h}" for h in range(n_heads)]),
        yaxis=dict(axis, title=dict(text="layer"), autorange="reversed",
                   tickvals=[y[la * (t + 1) + mid] for la in range(n_layers)],
                   ticktext=[f"L{la}" for la in range(n_layers)]),
        title=title_below_modebar(
            title or f"every head: {stage_caption(stage)} (click to zoom)", size=12),
        plot_bgcolor=MASKED, height=100 + MODEBAR_PX + cell_px * n_layers,
        width=max(MIN_MOSAIC_WIDTH, 110 + cell_px * n_heads),
        margin=dict(l=60, r=30, t=MODEBAR_PX + 50, b=50))
    return {"data": [trace], "layout": layout}


_MOSAIC_X, _MOSAIC_Y = re.compile(r"H(\d+) k\d"), re.compile(r"L(\d+) q\d")


def mosaic_head(point: dict) -> tuple[int, int]:
    """(layer, head) of a click on `head_mosaic_figure` (plotly's clickData point, with the
    cell's axis labels as "x" and "y"); ValueError on a gutter or a malformed point."""
    if not isinstance(point, dict):
        raise ValueError(f"click point {point!r} is not a dict")
    hx = _MOSAIC_X.match(str(point.get("x")))
    ly = _MOSAIC_Y.match(str(point.get("y")))
    if hx is None or ly is None:
        raise ValueError(f"click at x={point.get('x')!r}, y={point.get('y')!r} is not on a head")
    return int(ly.group(1)), int(hx.group(1))


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
