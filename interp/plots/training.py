"""Figures of the text-zoo studies (`attnlens.lab.text_studies`): training curves and
side-by-side comparisons of variants. Like `attnlens.interp.plots`, each takes a study table and
returns a plotly Figure.

Example:
    >>> from attnlens.lab.text_studies import released_models, training_logs
    >>> fig = phase_change_figure(training_logs(released_models("hooked_models/zoo")))
    ...                                                                   # doctest: +SKIP
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from attnlens.interp.plots.colors import SEQUENTIAL, VARIANT_COLOURS  # noqa: F401 (re-exported)

# One line style per shape, so a variant's models (one colour) stay apart: the 2-layer twins
# on the data mix and on the package corpus get their own.
SHAPE_DASH = {"l1": "dot", "l2": "solid", "l4mlp": "dash", "l2-mix": "dashdot",
              "l2-pkgs": "longdash"}
SHAPE_MARKER = {"l1": "circle", "l2": "circle", "l4mlp": "diamond", "l2-mix": "square",
                "l2-pkgs": "triangle-up"}


LEGEND_ROW_PX = 30   # one legend entry's height in a kaleido PNG (29 px measured)


def legend_height(n_entries: int) -> int:
    """Pixels a figure needs for a vertical legend of `n_entries` below its title: a figure
    shorter than this cuts the legend off (its last models are then not named)."""
    return 200 + LEGEND_ROW_PX * n_entries     # + the top and bottom margins (about 180 px)


def _need(df: pd.DataFrame, columns: list[str], what: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(f"{what} needs columns {missing}; got {list(df.columns)}")


def phase_change_figure(log: pd.DataFrame) -> go.Figure:
    """Induction score (top), second-copy / first-copy loss where the log has it (middle), and
    validation loss (bottom) against tokens seen, one line per model: colour = variant, dash =
    shape (1-layer controls dotted). The induction phase change shows as a jump in the score,
    a drop of the copy ratio and a bump in the loss. The score is read at the `pattern` stage,
    which for MTA is not a distribution (it can exceed 1); the copy ratio compares variants
    on behaviour alone."""
    _need(log, ["model", "variant", "shape", "tokens", "induction_score", "val_loss"],
          "phase_change_figure")
    panels = [("induction_score", "best head's induction score (pattern stage)", "score")]
    if "copy_loss_ratio" in log and log["copy_loss_ratio"].notna().any():
        panels.append(("copy_loss_ratio", "second-copy / first-copy loss, random tokens "
                       "(1: no copying)", "ratio"))
    panels.append(("val_loss", "validation loss", "loss (nats/token)"))
    fig = make_subplots(rows=len(panels), cols=1, shared_xaxes=True, vertical_spacing=0.07,
                        subplot_titles=[title for _, title, _ in panels])
    for name, g in log.groupby("model", sort=True):
        variant, shape = g["variant"].iloc[0], g["shape"].iloc[0]
        style = dict(color=VARIANT_COLOURS.get(variant), dash=SHAPE_DASH.get(shape, "solid"))
        symbol = SHAPE_MARKER.get(shape, "circle")
        for row, (column, _, _) in enumerate(panels, 1):
            fig.add_trace(go.Scatter(x=g["tokens"], y=g[column], mode="lines+markers",
                                     name=name, legendgroup=name, showlegend=row == 1,
                                     line=style, marker=dict(size=5, symbol=symbol)),
                          row=row, col=1)
    for row, (_, _, axis) in enumerate(panels, 1):
        fig.update_yaxes(title=axis, row=row, col=1)
    top = max(1.02, float(log["induction_score"].max()) * 1.05)
    fig.update_yaxes(range=[0, top], row=1, col=1)
    fig.update_xaxes(title="tokens seen", row=len(panels), col=1)
    fig.update_layout(title="Induction heads across training",
                      height=max(300 + 220 * len(panels), legend_height(log["model"].nunique())))
    return fig


def copy_distance_figure(table: pd.DataFrame) -> go.Figure:
    """Induction by copy distance: the best head's induction score (top) and the second-copy /
    first-copy loss ratio (bottom) of `[BOS] r r` against |r|, one line per model (colour =
    variant, dash = shape). An Infini model's segment length is a dotted vertical line: beyond
    it the earlier copy lies in an earlier segment, reachable only through the memory."""
    _need(table, ["model", "variant", "shape", "distance", "induction_score",
                  "copy_loss_ratio"], "copy_distance_figure")
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=["best head's induction score",
                                        "second-copy / first-copy loss (1: no copying)"])
    for name, g in table.groupby("model", sort=True):
        variant, shape = g["variant"].iloc[0], g["shape"].iloc[0]
        style = dict(color=VARIANT_COLOURS.get(variant), dash=SHAPE_DASH.get(shape, "solid"))
        symbol = SHAPE_MARKER.get(shape, "circle")
        for row, column in ((1, "induction_score"), (2, "copy_loss_ratio")):
            fig.add_trace(go.Scatter(x=g["distance"], y=g[column], mode="lines+markers",
                                     name=name, legendgroup=name, showlegend=row == 1,
                                     line=style, marker=dict(size=6, symbol=symbol)),
                          row=row, col=1)
    if "segment_len" in table:
        for seg in sorted(table["segment_len"].dropna().unique()):
            fig.add_vline(x=float(seg), line=dict(dash="dot", color="grey"),
                          annotation_text=f"Infini segment ({int(seg)})")
    fig.update_xaxes(title="copy distance |r| (tokens)", row=2, col=1)
    fig.update_yaxes(title="score", range=[0, 1.02], row=1, col=1)
    fig.update_yaxes(title="loss ratio", row=2, col=1)
    fig.update_layout(title="Induction by copy distance (probe [BOS] r r, random ids)",
                      height=max(620, legend_height(table["model"].nunique())))
    return fig


def diversity_comparison_figure(summary: pd.DataFrame) -> go.Figure:
    """Mean captured variance (lower = more diverse heads) of every model's layers, one
    horizontal bar per model and layer (so every label stays readable however many models the
    zoo holds), QK and OV panels side by side, composed circuits hatched, with the random-init
    baseline as a line."""
    _need(summary, ["model", "variant", "layer", "circuit", "composed", "mean_captured"],
          "diversity_comparison_figure")
    circuits = list(dict.fromkeys(summary["circuit"]))
    fig = make_subplots(rows=1, cols=len(circuits), shared_yaxes=True, horizontal_spacing=0.04,
                        subplot_titles=[f"{c.upper()} circuits" for c in circuits])
    order = list(dict.fromkeys(f"{m} L{x}" for m, x in zip(summary["model"], summary["layer"],
                                                             strict=True)))
    for i, c in enumerate(circuits):
        part = summary[summary["circuit"] == c]
        for composed, g in part.groupby("composed"):
            labels = [f"{m} L{x}" for m, x in zip(g["model"], g["layer"], strict=True)]
            fig.add_trace(go.Bar(
                y=labels, x=g["mean_captured"], orientation="h",
                marker=dict(color=[VARIANT_COLOURS.get(v) for v in g["variant"]],
                            pattern_shape="/" if composed else ""),
                name="composed" if composed else "per-head", legendgroup=str(composed),
                showlegend=i == 0), row=1, col=i + 1)
        if "baseline_mean_captured" in part:
            base = float(part["baseline_mean_captured"].mean())
            fig.add_vline(x=base, line=dict(dash="dash", color="black"),
                          annotation_text="random init", annotation_position="bottom right",
                          row=1, col=i + 1)
        fig.update_xaxes(title="mean captured variance (lower = more diverse)", range=[0, 1],
                         row=1, col=i + 1)
    fig.update_yaxes(categoryorder="array", categoryarray=order, autorange="reversed",
                     tickfont=dict(size=11))
    fig.update_layout(title="Head diversity by variant", barmode="group",
                      height=180 + 24 * len(order), width=1000,
                      margin=dict(t=120),
                      legend=dict(orientation="h", y=1.045, yanchor="bottom", x=1, xanchor="right",
                                  title_text=""))
    return fig


COPE_ROW_PX, COPE_TOP_PX = 26, 220   # a row of `cope_category_figure`; title, axis, margins


def cope_category_figure(table: pd.DataFrame) -> go.Figure:
    """Mean CoPE gate per head (rows) and key-token category (columns): what each head
    counts (`attnlens.interp.variants.cope.gates_by_category`; rows named by `model` too when the
    table has that
    column, several models' tables concatenated; columns in the table's order of first
    appearance). Sequential scale on [0, 1] with a colour bar."""
    _need(table, ["head_label", "category", "mean_gate"], "cope_category_figure")
    row = table["head_label"]
    table = table.assign(row=table["model"] + " " + row if "model" in table else row)
    grid = table.pivot_table(index="row", columns="category", values="mean_gate")
    grid = grid.reindex([r for r in dict.fromkeys(table["row"]) if r in grid.index])
    grid = grid[[c for c in dict.fromkeys(table["category"]) if c in grid.columns]]
    fig = go.Figure(go.Heatmap(z=grid.to_numpy(), x=list(grid.columns), y=list(grid.index),
                               zmin=0, zmax=1, colorscale=SEQUENTIAL,
                               colorbar=dict(title="mean gate"),
                               text=grid.to_numpy(), texttemplate="%{text:.2f}"))
    rows = list(grid.index)
    # every head labelled, in reading order (L0H0 on top), each row tall enough for its
    # numbers: a 4-layer model's 32 rows used to be squeezed into 450 px, plotly dropping
    # every other label (issue 56)
    fig.update_layout(title="CoPE: what each head counts (mean gate by key token category)",
                      xaxis_title="key token category",
                      yaxis=dict(title="head", autorange="reversed", tickmode="array",
                                 tickvals=rows, ticktext=rows),
                      height=COPE_TOP_PX + COPE_ROW_PX * len(rows))
    return fig
