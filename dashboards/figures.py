"""Plotly figures used by the dashboard pages (thin: they draw what interp computes)."""

from __future__ import annotations

import plotly.graph_objects as go
import torch
from plotly.subplots import make_subplots


def stage_grid(maps, head: int, labels: list[str], batch: int = 0) -> go.Figure:
    """One heatmap per stage for one head; -inf entries (masked) are drawn blank."""
    titles = [f"{m.stage.name} ({m.stage.softmax}-softmax"
              f"{', rows sum to 1' if m.stage.row_stochastic else ''})" for m in maps]
    cols = min(3, len(maps))
    rows = (len(maps) + cols - 1) // cols
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=titles,
                        horizontal_spacing=0.06, vertical_spacing=0.12)
    for i, m in enumerate(maps):
        z = m.values[batch, head].float()
        z = torch.where(torch.isfinite(z), z, torch.full_like(z, float("nan")))
        fig.add_trace(go.Heatmap(
            z=z.numpy(), x=labels, y=labels, coloraxis=None, showscale=False,
            colorscale="Blues" if m.stage.softmax == "post" else "RdBu",
            zmid=None if m.stage.softmax == "post" else 0.0,
            hovertemplate="query %{y}<br>key %{x}<br>value %{z:.4f}<extra>" + m.stage.name
                          + "</extra>"), row=i // cols + 1, col=i % cols + 1)
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(height=380 * rows, margin=dict(l=40, r=20, t=60, b=40))
    return fig

