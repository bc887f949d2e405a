"""Plotly figures for the analyses of `interp` (they draw what the analyses return).

Every function takes an analysis result (a tidy DataFrame or a tensor) and returns a
`plotly.graph_objects.Figure`; `save_figure` writes HTML, and PNG when kaleido is installed.

Example:
    >>> from attnlens.interp.tools.heads import induction_table
    >>> fig = head_heatmap(induction_table(model), "induction_stripe")   # doctest: +SKIP
    >>> save_figure(fig, "out/induction")                                # doctest: +SKIP
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from attnlens.interp.plots.colors import (
    CLASS_COLOURS,
    DIVERGING,
    MASKED,
    SEQUENTIAL,
    coloraxis_args,
    colorbar_title,
    colour,
    scale_args,
)

# The classes of a sigmoid gate (`attnlens.interp.tools.gating.classify_gate`) as the
# Infini-attention paper names them for its memory gate; other gates keep the threshold's words.
GATE_CLASS_NAMES = {"high": "high (mean >= 0.8)", "low": "low (mean <= 0.2)", "mixer": "mixer",
                    "intermediate": "intermediate", "excite": "excite", "inhibit": "inhibit",
                    "neutral": "neutral"}


def _head_scale(z, zmid: float | None) -> dict:
    """Colour arguments of a layer x head grid: zero-centred around `zmid` when given (or when
    values are signed), else one-sided from 0."""
    if zmid is None:
        return scale_args(z)
    a = np.asarray(z, dtype=float) - zmid
    m = float(np.nanmax(np.abs(a))) if np.isfinite(a).any() else 1.0
    m = m if m > 0 else 1.0
    return dict(colorscale=DIVERGING, zmin=zmid - m, zmax=zmid + m, zmid=zmid)


def _grid(df: pd.DataFrame, column: str) -> pd.DataFrame:
    return df.pivot_table(index="layer", columns="head", values=column, aggfunc="mean")


def head_heatmap(df: pd.DataFrame, column: str, title: str | None = None,
                 zmid: float | None = None) -> go.Figure:
    """Layer x head heatmap of `column` of a per-head table (columns `layer`, `head`)."""
    grid = _grid(df, column)
    fig = go.Figure(go.Heatmap(
        z=grid.to_numpy(), x=[f"H{h}" for h in grid.columns], y=[f"L{x}" for x in grid.index],
        **_head_scale(grid.to_numpy(), zmid),
        hovertemplate="%{y}%{x}: %{z:.3f}<extra>" + column + "</extra>"))
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(title=title or column, height=120 + 40 * len(grid), margin=dict(t=50))
    return fig


def head_table_figure(df: pd.DataFrame, columns: list[str], title: str = "") -> go.Figure:
    """Side-by-side layer x head heatmaps, one per score column (e.g. detector scores)."""
    fig = make_subplots(rows=1, cols=len(columns), subplot_titles=columns,
                        horizontal_spacing=0.06)
    for i, col in enumerate(columns):
        grid = _grid(df, col)
        fig.add_trace(go.Heatmap(
            z=grid.to_numpy(), x=[f"H{h}" for h in grid.columns],
            y=[f"L{x}" for x in grid.index], coloraxis="coloraxis",
            hovertemplate="%{y}%{x}: %{z:.3f}<extra>" + col + "</extra>"), row=1, col=i + 1)
    fig.update_yaxes(autorange="reversed")
    # Scores of stages after cross-head mixing can leave [0, 1]: the range fits the values, and
    # a signed table gets a zero-centred diverging scale.
    values = df[columns].to_numpy(dtype=float)
    lo, hi = float(np.nanmin(values)), float(np.nanmax(values))
    axis = coloraxis_args([lo, hi], signed=lo < 0, zmax=None if lo < 0 else max(hi, 1e-12))
    fig.update_layout(title=title, coloraxis=axis,
                      height=160 + 40 * df["layer"].nunique(), margin=dict(t=60))
    return fig


def ablation_figure(df: pd.DataFrame) -> go.Figure:
    """Induction score of each later head before and after an ablation (`induction_ablation`;
    a `hook` column, if present, gives one "after" bar per ablation site)."""
    d = df.reset_index() if "head_label" not in df.columns else df
    first = d.drop_duplicates("head_label")
    bars = [go.Bar(name="before", x=first["head_label"], y=first["before"])]
    groups = d.groupby("hook", sort=False) if "hook" in d.columns else [("z", d)]
    for hook, g in groups:
        bars.append(go.Bar(name=f"after ablating at hook_{hook}", x=g["head_label"],
                           y=g["after"]))
    fig = go.Figure(bars)
    fig.update_layout(barmode="group", title="Induction score before / after ablation",
                      yaxis_title="induction stripe score")
    return fig


def composition_figure(table: pd.DataFrame, mode: str = "K") -> go.Figure:
    """Source head x destination head composition scores, diverging around the baseline."""
    t = table[table["mode"] == mode]
    grid = t.pivot_table(index="source", columns="dest", values="score")
    base = float(t["baseline"].iloc[0]) if len(t) else 0.0
    fig = go.Figure(go.Heatmap(
        z=grid.to_numpy(), x=list(grid.columns), y=list(grid.index),
        **_head_scale(grid.to_numpy(), base),
        hovertemplate="%{y} -> %{x}: %{z:.3f}<extra>" + mode + "</extra>"))
    fig.update_yaxes(autorange="reversed", title="writer (earlier layer)")
    fig.update_xaxes(title="reader (later layer)")
    fig.update_layout(title=f"{mode}-composition (colour centred on random baseline "
                            f"{base:.3f})", height=200 + 18 * len(grid))
    return fig


def copying_figure(df: pd.DataFrame) -> go.Figure:
    """Copying score (OV eigenvalue positivity) of every head as a layer x head heatmap."""
    fig = head_heatmap(df, "copying", "Copying score sum(lambda)/sum(|lambda|)", zmid=0.0)
    fig.data[0].update(zmin=-1, zmax=1, zmid=0.0)
    return fig


def diversity_figure(curves: pd.DataFrame) -> go.Figure:
    """Cumulative captured variance vs number of components, one line per layer; the
    random-init baseline dashed; one panel per circuit (`head_diversity`). A layer has one
    colour in every panel, so the one legend (entry "L1": both panels' L1 lines, a click
    hides both) reads for the QK and the OV panel alike (issue 56: the OV lines took other
    colours than the legend's)."""
    circuits = list(dict.fromkeys(curves["circuit"]))
    fig = make_subplots(rows=1, cols=len(circuits), subplot_titles=[c.upper() for c in circuits],
                        shared_yaxes=True)
    layers = sorted(set(curves.loc[curves["source"] != "random", "layer"]))
    for i, c in enumerate(circuits):
        part = curves[curves["circuit"] == c]
        for (layer, source), g in part.groupby(["layer", "source"]):
            random = source == "random"
            line = dict(dash="dash", color="black") if random \
                else dict(color=colour(layers.index(layer)))
            group = "random" if random else str(layer)
            fig.add_trace(go.Scatter(
                x=g["k"], y=g["captured"], mode="lines",
                name="random init" if random else f"L{layer}", legendgroup=group,
                showlegend=i == 0, line=line), row=1, col=i + 1)
        fig.add_hline(y=0.9, line=dict(dash="dot", color="grey"), row=1, col=i + 1)
    fig.update_xaxes(title="components k")
    fig.update_yaxes(title="cumulative captured variance", range=[0, 1.02], col=1)
    fig.update_layout(title="Head diversity (lower curve = more diverse heads)")
    return fig


def gate_figure(df: pd.DataFrame, class_names: dict | None = None) -> go.Figure:
    """Mean gate per head (with min-max range), one panel per gate stage, coloured by class.

    `class_names` renames `attnlens.interp.tools.gating` classes (default `GATE_CLASS_NAMES`); for
    an Infini-attention model pass `attnlens.interp.variants.infini.CLASS_NAMES`, so that this
    figure and `memory_figure` call a class the same ("memory specialist", "local specialist")."""
    names = {**GATE_CLASS_NAMES, **(class_names or {})}
    df = df.assign(**{"class": df["class"].map(lambda c: names.get(c, c))}) if len(df) else df
    if not len(df):
        fig = go.Figure()
        fig.add_annotation(text="no per-head gate stage in this model's catalogue",
                           showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")
        return fig
    stages = list(dict.fromkeys(df["stage"]))
    fig = make_subplots(rows=len(stages), cols=1, subplot_titles=stages, shared_xaxes=False)
    for i, stage in enumerate(stages):
        part = df[df["stage"] == stage]
        for cls, g in part.groupby("class"):
            fig.add_trace(go.Scatter(
                x=g["head_label"], y=g["mean"], mode="markers", name=cls,
                marker=dict(size=10, color=CLASS_COLOURS.get(cls)), showlegend=i == 0,
                error_y=dict(type="data", symmetric=False, array=g["max"] - g["mean"],
                             arrayminus=g["mean"] - g["min"])), row=i + 1, col=1)
    # Heads in layer/head order, not grouped by class.
    fig.update_xaxes(categoryorder="array", categoryarray=list(dict.fromkeys(df["head_label"])))
    fig.update_layout(title="Gate values per head", height=260 * len(stages))
    return fig


def memory_figure(df: pd.DataFrame) -> go.Figure:
    """Infini-attention: gate vs memory contribution ratio per head, coloured by class."""
    fig = go.Figure()
    for cls, g in df.groupby("class"):
        fig.add_trace(go.Scatter(x=g["gate"], y=g["memory_ratio"], mode="markers+text",
                                 text=list(g.index), textposition="top center", name=cls,
                                 marker=dict(size=11, color=CLASS_COLOURS.get(cls))))
    fig.update_xaxes(title="gate sigmoid(beta)", range=[-0.05, 1.05])
    fig.update_yaxes(title="|g A_mem| / |A|")
    fig.update_layout(title="Memory vs local specialisation")
    return fig


def mixing_figure(M: torch.Tensor, layer: int, phase: str) -> go.Figure:
    """Heatmap of a `[head head]` mixing matrix: row = source head, column = mixed head."""
    H = M.shape[0]
    labels = [f"L{layer}H{h}" for h in range(H)]
    fig = go.Figure(go.Heatmap(z=M.detach().double().numpy(), x=labels, y=labels,
                               **scale_args(M.detach().double().numpy(), signed=True),
                               hovertemplate="%{y} -> %{x}: %{z:.3f}<extra></extra>"))
    fig.update_yaxes(autorange="reversed", title="source head")
    fig.update_xaxes(title="mixed head")
    fig.update_layout(title=f"Layer {layer} {phase}-softmax head mixing")
    return fig


def kernel_figure(kernels: torch.Tensor, classes: list[str] | None = None,
                  title: str = "", cell_px: int = 34,
                  key_centre: int | None = None, max_width: int | None = None) -> go.Figure:
    """Small multiples of `[head c_q c_k]` key-query kernels (rows: query offset, current
    query at the bottom; columns: key offset), square cells of `cell_px` pixels, one shared
    zero-centred colour bar, every offset labelled. With `key_centre`, the column of the
    query's own key (`attnlens.interp.variants.mta.kernel_centre`), the offsets read relative to the
    map
    cell:
    queries `i-1, i`, keys `j-2 ... j ... j+2`; without it, as kernel indices 0, 1, ...
    With `max_width` (pixels), cells shrink (to 12 px at least) so four panels fit across it."""
    H, cq, ck = kernels.shape
    titles = [f"H{h}" + (f" ({classes[h]})" if classes else "") for h in range(H)]
    cols = min(H, 4)
    rows = (H + cols - 1) // cols
    gap_x, gap_y = 60, 70                             # room for ticks and subplot titles
    if max_width is not None:
        cell_px = max(12, min(cell_px, int(((max_width - 160) / cols - gap_x) / ck)))
    w, h_px = ck * cell_px, cq * cell_px            # one kernel's plot area
    width, height = cols * (w + gap_x) + 160, rows * (h_px + gap_y) + 90
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=titles,
                        horizontal_spacing=gap_x / width, vertical_spacing=gap_y / height)
    vmax = float(kernels.abs().max()) or 1.0
    for h in range(H):
        fig.add_trace(go.Heatmap(z=kernels[h].double().numpy(), coloraxis="coloraxis",
                                 x=list(range(ck)), y=list(range(cq)),
                                 hovertemplate=f"H{h} query offset %{{y}}, key offset %{{x}}: "
                                 "%{z:.3f}<extra></extra>"),
                      row=h // cols + 1, col=h % cols + 1)
    fig.update_xaxes(tickmode="linear", dtick=1, title_text="key offset",
                     title_font=dict(size=10), constrain="domain")
    fig.update_yaxes(tickmode="linear", dtick=1, autorange="reversed", constrain="domain")
    if key_centre is not None:
        if not 0 <= key_centre < ck:
            raise ValueError(f"key_centre {key_centre} is not a column of a {ck}-wide kernel")
        fig.update_xaxes(tickmode="array", tickvals=list(range(ck)), title_text="key",
                         ticktext=[f"j{b - key_centre:+d}" if b != key_centre else "j"
                                   for b in range(ck)])
        fig.update_yaxes(tickmode="array", tickvals=list(range(cq)), title_text="query",
                         ticktext=[f"i{a - cq + 1:+d}" if a != cq - 1 else "i"
                                   for a in range(cq)])
    for i in range(H):   # square cells in every panel
        suffix = "" if i == 0 else str(i + 1)
        fig.layout[f"yaxis{suffix}"].update(scaleanchor=f"x{suffix}", scaleratio=1)
    fig.update_layout(title=title, width=width, height=height,
                      coloraxis=dict(colorscale=DIVERGING, cmin=-vmax, cmax=vmax, cmid=0.0,
                                     colorbar=dict(title=dict(text="weight", side="right"),
                                                   thickness=14, len=max(0.5, 1.0 / rows))),
                      margin=dict(l=60, r=40, t=70, b=40))
    return fig


def stage_change_figure(df: pd.DataFrame, metric: str = "js") -> go.Figure:
    """Heads x stage transitions heatmap of a `catalogue_changes` / `stage_change` table."""
    d = df.reset_index() if "head_label" not in df.columns else df
    step = d["source"] + " -> " + d["target"]
    grid = d.assign(step=step).pivot_table(index="head_label", columns="step", values=metric,
                                           sort=False)
    z = grid.to_numpy(dtype=float)
    fig = go.Figure(go.Heatmap(z=z, x=list(grid.columns), y=list(grid.index),
                               **scale_args(z), colorbar=dict(title=colorbar_title(
                                   metric, bool(np.isnan(z).any()), "not comparable")),
                               hoverongaps=False,
                               hovertemplate="%{y} %{x}: %{z:.3f}<extra>" + metric
                                             + "</extra>"))
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(title=f"Stage-to-stage change ({metric})", height=200 + 16 * len(grid),
                      plot_bgcolor=MASKED)
    return fig


def positional_attention_figure(maps: torch.Tensor, head: int, batch: int = 0,
                                labels: list[str] | None = None) -> go.Figure:
    """CoPE positional-only attention softmax(q.e[p]) of one head (`positional_attention`)."""
    z = maps[batch, head].double().numpy()
    fig = go.Figure(go.Heatmap(z=z, x=labels, y=labels, colorscale=SEQUENTIAL, zmin=0,
                               zmax=float(np.nanmax(z)) if np.isfinite(z).any() else 1.0))
    fig.update_layout(plot_bgcolor=MASKED)
    fig.update_yaxes(autorange="reversed", title="query")
    fig.update_xaxes(title="key")
    fig.update_layout(title=f"Positional-only attention, head {head}")
    return fig


def write_plotlyjs(directory: str | Path) -> Path:
    """Write plotly's `plotly.min.js` into `directory` (once) and return its path."""
    from plotly.offline import get_plotlyjs

    path = Path(directory) / "plotly.min.js"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(get_plotlyjs(), encoding="utf-8")
    return path


def kaleido_available() -> bool:
    """Whether plotly can write PNG (needs the optional `kaleido` package)."""
    try:
        import kaleido  # noqa: F401
    except ImportError:
        return False
    return True


def save_figure(fig: go.Figure, path: str | Path, png: bool = True,
                plotlyjs: str | bool = "directory") -> list[Path]:
    """Write `path`.html and `path`.png (when kaleido is installed and `png`).

    By default the HTML loads `plotly.min.js` from its own directory (written once beside it),
    so a folder of figures works offline without repeating the 3.5 MB library; `plotlyjs` is
    passed to `write_html(include_plotlyjs=...)` (True: inline, or a path ending in ".js").
    Returns the paths written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    html = path.with_suffix(".html")
    fig.write_html(html, include_plotlyjs=plotlyjs)
    written = [html]
    if png and kaleido_available():
        from attnlens.interp.plots.png import PngError, write_png

        try:
            written.append(write_png(fig, path.with_suffix(".png")))
        except PngError as error:   # e.g. kaleido without a browser: keep the HTML, say so
            warnings.warn(f"{error}; {html.name} is written", stacklevel=2)
    return written


def save_pngs(figures) -> list[Path]:
    """The PNGs of many figures, `(fig, path)` pairs (`path`.png is written), drawn with one
    Chromium start (`png.write_pngs`) when kaleido is installed; returns the paths written.

    `save_figure(png=False)` writes their HTML. If kaleido rejects a figure, the figures are
    drawn one by one so the others still get theirs; a figure without a PNG is warned about,
    as `save_figure` does."""
    figures = [(fig, Path(path).with_suffix(".png")) for fig, path in figures]
    if not figures or not kaleido_available():
        return []
    from attnlens.interp.plots.png import PngError, PngTimeout, write_png, write_pngs

    try:
        return write_pngs([(fig, path, None, None) for fig, path in figures])
    except PngTimeout as error:
        warnings.warn(f"{error}; their HTML is written", stacklevel=2)
        return []
    except PngError:
        pass
    written = []
    for fig, path in figures:
        try:
            written.append(write_png(fig, path))
        except PngError as error:
            warnings.warn(f"{error}; {path.with_suffix('.html').name} is written", stacklevel=2)
    return written
