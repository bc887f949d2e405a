"""Summary figures of a sweep: models side by side, one figure per analysis and score.

    heads        heatmap model x head per detector and prompt set
    gates        heatmap model x (head, stage) of the mean gate, per prompt set
    composition  the largest composition z-score of each model, per mode
    diversity    k90 (heads needed for 90% of the captured variance) per model, layer, circuit
    circuit      the mean score of the edges with the largest |score|, per model

Written as HTML (and PNG when kaleido works) through `attnlens.interp.plots.save_figure`.

Example:
    >>> write_figures(summary, "out/figures", png=False)       # doctest: +SKIP
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import plotly.graph_objects as go

from attnlens.interp import plots
from attnlens.interp.sweep.analyses import ANALYSES


def model_head_heatmap(table: pd.DataFrame, value: str, column: str = "head_label",
                       title: str = "") -> go.Figure:
    """Heatmap with one row per model and one column per `column` value, coloured by `value`."""
    order = (table[[column, "layer", "head"]].drop_duplicates(column)
             .sort_values(["layer", "head"])[column].tolist()
             if {"layer", "head"} <= set(table.columns) else sorted(table[column].unique()))
    grid = table.pivot_table(index="model", columns=column, values=value, aggfunc="mean",
                             sort=False).reindex(columns=order)
    z = grid.to_numpy(dtype=float)
    fig = go.Figure(go.Heatmap(z=z, x=list(grid.columns), y=list(grid.index),
                               **plots.scale_args(z),
                               colorbar={"title": value}, hoverongaps=False))
    fig.update_layout(title=title or value, xaxis_title=column, yaxis_title="model",
                      height=200 + 30 * len(grid.index))
    return fig


def _bar(table: pd.DataFrame, x: str, y: str, colour: str, title: str) -> go.Figure:
    fig = go.Figure()
    for name, part in table.groupby(colour, sort=False):
        fig.add_bar(x=part[x].astype(str), y=part[y], name=str(name))
    fig.update_layout(title=title, barmode="group", xaxis_title=x, yaxis_title=y)
    return fig


def sweep_figures(summary: pd.DataFrame) -> dict[str, go.Figure]:
    """name -> figure for every analysis in a sweep summary that has a figure."""
    figs: dict[str, go.Figure] = {}
    for (analysis, kind, pset), part in summary.groupby(["analysis", "kind", "prompt_set"],
                                                        sort=False):
        where = f"{analysis}_{pset}" if pset else analysis
        if kind == "heads":
            for det in [d for d in ANALYSES["heads"].summary if d in part.columns]:
                for stage, sp in part.groupby("stage", sort=False):
                    figs[f"{where}_{det}_{stage}"] = model_head_heatmap(
                        sp, det, title=f"{det} ({stage}) on {pset}")
        elif kind == "gates" and len(part):
            part = part.assign(head_stage=part["head_label"] + " " + part["stage"])
            figs[f"{where}_mean"] = model_head_heatmap(part, "mean", "head_stage",
                                                       f"mean gate on {pset}")
        elif kind == "composition" and len(part):
            best = part.groupby(["model", "mode"], sort=False)["z"].max().reset_index()
            figs[where] = _bar(best, "model", "z", "mode", "largest composition z-score")
        elif kind == "circuit" and "score" in part.columns and len(part):
            strength = part.groupby("edge", sort=False)["score"].apply(
                lambda x: x.abs().max()).sort_values(ascending=False)
            top = part[part["edge"].isin(strength.index[:15])]
            figs[where] = _bar(top, "edge", "score", "model",
                               f"edge scores on {pset} (15 largest |score|)")
        elif kind == "diversity" and "k90" in part.columns:
            part = part.assign(layer_circuit=part["circuit"] + " L" +
                               part["layer"].astype(int).astype(str))
            figs[where] = _bar(part, "layer_circuit", "k90", "model",
                               "heads for 90% captured variance (k90)")
    return figs


def write_figures(summary: pd.DataFrame, folder: str | Path, png: bool = True) -> list[Path]:
    """Save every sweep figure under `folder` (plotly.min.js written once beside them)."""
    folder = Path(folder)
    figs = sweep_figures(summary)
    written: list[Path] = []
    if figs:
        folder.mkdir(parents=True, exist_ok=True)
        plots.write_plotlyjs(folder)
    for name, fig in figs.items():
        written += plots.save_figure(fig, folder / name, png=png)
    return written
