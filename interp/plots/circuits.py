"""Figures of circuits: a head's full QK / OV circuit over chosen tokens, copying scores, and
composition scores against their random baseline. Signed values get a diverging scale centred on
0 with a symmetric range; every figure has a colour bar and axis titles.

Example:
    >>> ids = circuit_token_ids(model, tokens)                                 # doctest: +SKIP
    >>> token_circuit_figure(token_circuit(model, 1, 0, ids, "qk"), labels, "qk")
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from attnlens.interp.plots.colors import DIVERGING
from attnlens.interp.plots.maps import token_ticks

TEXT_TOKENS = 12
AXES = {"qk": ("query token", "key token", "content score"),
        "ov": ("source token (attended to)", "output logit of token", "logit change")}


def _symmetric(values) -> float:
    finite = np.asarray(values, dtype=float)
    finite = finite[np.isfinite(finite)]
    m = float(np.abs(finite).max()) if finite.size else 0.0
    return m if m > 0 else 1.0


def token_circuit_figure(matrix: torch.Tensor, labels: list[str], kind: str,
                         title: str = "") -> go.Figure:
    """A `[n n]` full circuit over tokens `labels`
    (`attnlens.interp.circuits.tokens.token_circuit`)."""
    if kind not in AXES:
        raise ValueError(f"kind={kind!r}; choose one of {list(AXES)}")
    n = len(labels)
    if tuple(matrix.shape) != (n, n):
        raise ValueError(f"a {tuple(matrix.shape)} circuit for {n} labels; need {n} x {n}")
    if len(set(labels)) != n:
        raise ValueError("token labels must be distinct")
    rows, columns, bar = AXES[kind]
    m = _symmetric(matrix)
    # three significant digits (circuits of small models are often far below 0.01) need
    # wider cells than attention maps' two decimals: numbers up to TEXT_TOKENS tokens
    text = dict(texttemplate="%{z:.3g}", textfont=dict(size=9)) if n <= TEXT_TOKENS else {}
    fig = go.Figure(go.Heatmap(
        z=matrix.double().numpy(), x=labels, y=labels, colorscale=DIVERGING, zmin=-m, zmax=m,
        zmid=0.0, colorbar=dict(title=dict(text=bar, side="right"), thickness=14), **text,
        hovertemplate=f"{rows} %{{y}}<br>{columns} %{{x}}<br>%{{z:.4f}}<extra>{kind}</extra>"))
    fig.update_xaxes(title=columns, tickangle=-90, **token_ticks(labels))
    fig.update_yaxes(title=rows, autorange="reversed", **token_ticks(labels))
    fig.update_layout(title=dict(text=title or f"full {kind.upper()} circuit", font=dict(size=13)),
                      height=min(260 + 16 * n, 900), margin=dict(l=60, r=20, t=50, b=60))
    return fig


def copying_scores_figure(df: pd.DataFrame, title: str = "") -> go.Figure:
    """Layer x head copying scores (`attnlens.interp.circuits.qk_ov.copying_scores`) on a fixed -1
    .. 1 diverging scale: +1 copies the attended token, -1 suppresses it."""
    grid = df.pivot_table(index="layer", columns="head", values="copying")
    fig = go.Figure(go.Heatmap(
        z=grid.to_numpy(), x=[f"H{h}" for h in grid.columns], y=[f"L{x}" for x in grid.index],
        colorscale=DIVERGING, zmin=-1.0, zmax=1.0, zmid=0.0, texttemplate="%{z:.2f}",
        colorbar=dict(title="copying"), hovertemplate="%{y}%{x}: %{z:.3f}<extra>copying</extra>"))
    fig.update_yaxes(autorange="reversed", title="layer")
    fig.update_xaxes(title="head")
    fig.update_layout(title=title or "Copying score sum(λ)/sum(|λ|) of the full OV circuit",
                      height=160 + 40 * len(grid), margin=dict(t=50))
    return fig


def composition_vs_baseline_figure(table: pd.DataFrame, modes=("Q", "K", "V"),
                                   title: str = "") -> go.Figure:
    """Writer head x reader head composition scores
    (`attnlens.interp.circuits.qk_ov.composition_table`), one panel per mode, coloured by score
    minus the random baseline (diverging, centred on 0: red = more composition than random matrices
    of the same sizes); hover shows score and baseline."""
    modes = [m for m in modes if m in set(table["mode"])]
    if not modes:
        raise ValueError("the composition table is empty: the model needs two layers or more")
    extent = _symmetric((table["score"] - table["baseline"]).to_numpy())
    fig = make_subplots(rows=1, cols=len(modes), horizontal_spacing=0.08, subplot_titles=[
        f"{m}-composition (baseline {table.loc[table['mode'] == m, 'baseline'].iloc[0]:.3f})"
        for m in modes])
    for i, mode in enumerate(modes):
        t = table[table["mode"] == mode]
        score = t.pivot_table(index="source", columns="dest", values="score", sort=False)
        base = t.pivot_table(index="source", columns="dest", values="baseline", sort=False)
        fig.add_trace(go.Heatmap(
            z=(score - base).to_numpy(), x=list(score.columns), y=list(score.index),
            customdata=score.to_numpy(), coloraxis="coloraxis",
            hovertemplate="%{y} -> %{x}<br>score %{customdata:.3f}<br>minus baseline "
                          "%{z:+.3f}<extra>" + mode + "</extra>"), row=1, col=i + 1)
        fig.update_xaxes(title="reader (later layer)", row=1, col=i + 1)
    fig.update_yaxes(autorange="reversed")
    fig.update_yaxes(title="writer (earlier layer)", col=1)
    n = table["source"].nunique()
    fig.update_layout(title=title or "Composition scores minus the random baseline",
                      coloraxis=dict(colorscale=DIVERGING, cmin=-extent, cmax=extent, cmid=0.0,
                                     colorbar=dict(title="score - baseline")),
                      height=min(220 + 18 * n, 1200), margin=dict(t=80))
    return fig
