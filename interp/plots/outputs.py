"""Figures of what models predict and of the induction study: loss by position, top-k
predictions, the repeated-text loss drop, ablation effects and the induction score across
training. Each figure has axis titles and, where colour carries a value, a colour bar.

Example:
    >>> fig = position_loss_figure({"m": (next_token_losses(model, t).mean(0), labels)})
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots

from attnlens.interp.plots.analyses import head_table_figure
from attnlens.interp.plots.colors import QUALITATIVE as COLOURS  # noqa: F401 (re-exported)
from attnlens.interp.plots.colors import SEQUENTIAL
from attnlens.interp.plots.colors import colour as _colour
from attnlens.interp.plots.maps import token_ticks
from attnlens.interp.tools.outputs import RepeatLosses


def position_loss_figure(curves: dict[str, tuple[torch.Tensor, list[str]]],
                         title: str = "Next-token loss by position") -> go.Figure:
    """One line per model: `curves[name] = (losses [pos-1], position labels [pos])`; the point
    at position i is the loss of predicting token i (label i) from the tokens before it."""
    fig = go.Figure()
    for i, (name, (losses, labels)) in enumerate(curves.items()):
        x = list(range(1, len(losses) + 1))
        fig.add_trace(go.Scatter(
            x=x, y=[float(v) for v in losses], mode="lines+markers", name=name,
            line=dict(color=_colour(i)), marker=dict(size=4),
            customdata=labels[1:len(losses) + 1],
            hovertemplate="predicting %{customdata}: %{y:.3f} nats<extra>" + name + "</extra>"))
    fig.update_xaxes(title="position of the predicted token")
    fig.update_yaxes(title="loss (nats)", rangemode="tozero")
    fig.update_layout(title=title, height=360, margin=dict(t=50), hovermode="closest")
    return fig


def top_k_figure(table: pd.DataFrame, title: str = "") -> go.Figure:
    """Positions (rows) x rank (columns) of `attnlens.interp.tools.outputs.top_predictions`: each
    cell shows the
    predicted token, its colour the probability (0 .. 1); a tick marks the true next token."""
    positions = sorted(table["position"].unique())
    k = int(table["rank"].max())
    grid = table.pivot(index="position", columns="rank", values="prob").loc[positions]
    words = table.assign(text=table["prediction"].map(repr).str[1:-1]
                         + table["correct"].map({True: " ✓", False: ""}))
    text = words.pivot(index="position", columns="rank", values="text").loc[positions]
    first = table[table["rank"] == 1].set_index("position").loc[positions]
    labels = [f"{p}:{t}" for p, t in zip(positions, first["token"], strict=True)]
    fig = go.Figure(go.Heatmap(
        z=grid.to_numpy(), x=[f"#{r}" for r in range(1, k + 1)], y=labels,
        text=text.to_numpy(), texttemplate="%{text}", colorscale=SEQUENTIAL, zmin=0.0, zmax=1.0,
        colorbar=dict(title="probability"),
        hovertemplate="after %{y}, rank %{x}: %{text} p=%{z:.3f}<extra></extra>"))
    fig.update_yaxes(autorange="reversed", title="input position: token",
                     **token_ticks(labels))
    fig.update_xaxes(title="rank of the prediction", side="top")
    fig.update_layout(title=title or "Top predictions of the next token",
                      height=min(120 + 22 * len(positions), 3000), margin=dict(t=90))
    return fig


def repeat_loss_figure(results: dict[str, RepeatLosses]) -> go.Figure:
    """Per model, the loss of each token of a text read the first time (dotted) and the second
    time (solid); the legend gives each model's mean drop."""
    fig = go.Figure()
    for i, (name, r) in enumerate(results.items()):
        t = r.table
        for copy, dash in (("first", "dot"), ("second", "solid")):
            fig.add_trace(go.Scatter(
                x=t["offset"], y=t[copy], mode="lines+markers", line=dict(color=_colour(i),
                                                                        dash=dash),
                marker=dict(size=4), customdata=t["token"],
                name=f"{name}: {copy} copy" + (f" (mean drop {r.mean_drop:.3f})"
                                               if copy == "second" else ""),
                hovertemplate="%{customdata}: %{y:.3f} nats<extra>" + f"{name} {copy}"
                              "</extra>"))
    fig.update_xaxes(title="token of the text (offset from its start)")
    fig.update_yaxes(title="loss (nats)", rangemode="tozero")
    fig.update_layout(title="The text read twice: loss on the first and the second copy",
                      height=380, margin=dict(t=50))
    return fig


def scores_figure(table: pd.DataFrame, columns: list[str], title: str = "") -> go.Figure:
    """Layer x head heatmaps of score `columns` (one panel each) with one colour bar: 0 .. max
    for non-negative scores, diverging around 0 when any is negative."""
    fig = head_table_figure(table, columns, title=title)
    fig.update_xaxes(title="head")
    fig.update_yaxes(title="layer", col=1)
    fig.update_layout(coloraxis_colorbar=dict(title="score"))
    return fig


def ablation_effect_figure(table: pd.DataFrame, loss: dict[str, float], score: str,
                           title: str = "") -> go.Figure:
    """Score `score` of every head before and after the ablation (`ablation_effect`), with the
    probe loss before and after in the title."""
    t = table[table["score"] == score]
    if t.empty:
        raise ValueError(f"no score {score!r} in the ablation table; have "
                         f"{sorted(table['score'].unique())}")
    fig = go.Figure([go.Bar(name="before", x=t["head_label"], y=t["before"],
                            marker_color="#7f7f7f"),
                     go.Bar(name="after", x=t["head_label"], y=t["after"],
                            marker_color="#d62728")])
    fig.update_xaxes(title="head")
    fig.update_yaxes(title=f"{score} score")
    fig.update_layout(barmode="group", height=360, margin=dict(t=70), title=(
        (title + "<br>" if title else "") + f"probe loss {loss['before']:.3f} -> "
        f"{loss['after']:.3f} nats ({loss['delta']:+.3f})"))
    return fig


def training_curve_figure(curves: dict[str, pd.DataFrame], key: str = "induction_score"
                          ) -> go.Figure:
    """`key` against training step, one line per model
    (`attnlens.interp.tools.induction_study.training_curve`),
    with the repeated-text loss on a second axis where the log has it."""
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    for i, (name, df) in enumerate(curves.items()):
        fig.add_trace(go.Scatter(x=df["step"], y=df[key], mode="lines+markers", name=name,
                                 line=dict(color=_colour(i))), secondary_y=False)
        if "repeat_loss" in df.columns:
            fig.add_trace(go.Scatter(x=df["step"], y=df["repeat_loss"], mode="lines",
                                     name=f"{name}: repeat loss",
                                     line=dict(color=_colour(i), dash="dot")), secondary_y=True)
    fig.update_xaxes(title="training step")
    fig.update_yaxes(title=key.replace("_", " "), secondary_y=False)
    fig.update_yaxes(title="loss on repeated tokens (nats)", secondary_y=True)
    fig.update_layout(title="Induction score across training", height=360, margin=dict(t=50))
    return fig

