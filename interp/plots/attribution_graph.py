"""Draw a pruned attribution graph (plotly): prompt positions across, layers up.

Rows from the bottom: token embeddings ("E"), then each layer's features (circles, size by
influence) and error nodes (grey diamonds), then the logits. Edges: red raises the target,
blue lowers it, width and opacity by |weight| (three classes, one trace each). Each node's
`customdata` is its index in the graph, for click handlers.
"""

from __future__ import annotations

import plotly.graph_objects as go
import torch

from attnlens.interp.plots.colors import scale_args
from attnlens.interp.plots.views import shown_text

EDGE_CLASSES = ((0.5, 3.0, 0.75), (0.15, 1.6, 0.45), (0.0, 0.7, 0.25))   # (min share, width, alpha)


def node_positions(graph, node_mask) -> dict[int, tuple[float, float]]:
    """(x, y) of each kept node: x the position (nodes sharing a cell spread out), y the row."""
    cells: dict[tuple[int, int], list[int]] = {}
    for index in node_mask.nonzero().flatten().tolist():
        kind = graph.node_kind(index)
        if kind == "feature":
            layer, pos, _ = graph.features[index].tolist()
            cell = (pos, layer)
        elif kind == "error":
            layer, pos = divmod(index - graph.n_features, graph.n_pos)
            cell = (pos, layer)
        elif kind == "embedding":
            cell = (index - graph.n_features - graph.n_errors, -1)
        else:
            cell = (graph.n_pos - 1, graph.n_layers)
        cells.setdefault(cell, []).append(index)
    xy = {}
    for (pos, row), members in cells.items():
        if row == graph.n_layers:   # logits: a row of their own, leftwards from the last token
            for i, index in enumerate(sorted(members)):
                xy[index] = (pos - 0.9 * i, row)
            continue
        width = min(0.8, 0.12 * (len(members) - 1))
        for i, index in enumerate(sorted(members)):
            offset = 0 if len(members) == 1 else -width / 2 + width * i / (len(members) - 1)
            xy[index] = (pos + offset, row)
    return xy


def graph_figure(graph, pruned, title: str = "", max_edges: int | None = 400) -> go.Figure:
    """The pruned graph; only the `max_edges` strongest kept edges are drawn (None: all), the
    title says how many."""
    xy = node_positions(graph, pruned.node_mask)
    fig = go.Figure()
    edges = pruned.edge_mask.nonzero()
    weights = graph.adjacency[edges[:, 0], edges[:, 1]].double() if len(edges) else \
        torch.zeros(0, dtype=torch.float64)
    n_kept = len(edges)
    if max_edges is not None and n_kept > max_edges:
        strongest = weights.abs().argsort(descending=True)[:max_edges]
        edges, weights = edges[strongest], weights[strongest]
        title = f"{title} ({max_edges} strongest of {n_kept} edges drawn)".strip()
    edges = edges.tolist()
    top = float(weights.abs().max()) if len(weights) else 1.0
    for sign, color in ((1, "214,39,40"), (-1, "31,119,180")):
        for low, width, alpha in EDGE_CLASSES:
            xs, ys = [], []
            for (t, s), w in zip(edges, weights.tolist(), strict=True):
                share = abs(w) / top
                if (w > 0) != (sign > 0) or share < low or share >= _upper(low):
                    continue
                if t in xy and s in xy:
                    xs += [xy[s][0], xy[t][0], None]
                    ys += [xy[s][1], xy[t][1], None]
            if xs:
                fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", hoverinfo="skip",
                                         line=dict(width=width, color=f"rgba({color},{alpha})"),
                                         showlegend=False))
    influence = pruned.node_influence
    scale = float(influence[:graph.n_features].max()) if graph.n_features else 1.0
    for kind, symbol, color in (("feature", "circle", "#ff7f0e"), ("error", "diamond", "#999999"),
                                ("embedding", "square", "#2ca02c"), ("logit", "star", "#9467bd")):
        members = [i for i in xy if graph.node_kind(i) == kind]
        if not members:
            continue
        sizes = [8 + 18 * float(influence[i]) / max(scale, 1e-12) if kind == "feature" else 12
                 for i in members]
        hover = [f"{graph.node_label(i)}<br>influence {float(influence[i]):.3f}"
                 + (f"<br>activation {float(graph.activations[i]):.3f}" if kind == "feature"
                    else "") for i in members]
        labels = [graph.logit_token_strings[i - (graph.n_nodes - graph.n_logits)]
                  for i in members] if kind == "logit" else None
        fig.add_trace(go.Scatter(
            x=[xy[i][0] for i in members], y=[xy[i][1] for i in members],
            mode="markers+text" if labels else "markers", text=labels,
            textposition=["top center" if j % 2 == 0 else "bottom center"
                          for j in range(len(members))], name=kind, customdata=members,
            marker=dict(symbol=symbol, size=sizes, color=color, line=dict(width=1,
                                                                          color="#333")),
            hovertext=hover, hoverinfo="text"))
    fig.update_layout(
        title=title, height=180 + 110 * (graph.n_layers + 2), plot_bgcolor="white",
        xaxis=dict(tickmode="array", tickvals=list(range(graph.n_pos)),
                   ticktext=[f"{i}:{shown_text(t)}" for i, t in enumerate(graph.prompt_tokens)],
                   tickangle=-60, showgrid=False),
        yaxis=dict(tickmode="array", tickvals=list(range(-1, graph.n_layers + 1)),
                   ticktext=["E"] + [f"L{layer}" for layer in range(graph.n_layers)] + ["logit"],
                   showgrid=True, gridcolor="#eee"),
        legend=dict(orientation="h", y=-0.12, x=0, yanchor="top"),
        margin=dict(l=50, r=20, t=60, b=110))
    return fig


def _upper(low: float) -> float:
    bounds = sorted(c[0] for c in EDGE_CLASSES)
    higher = [b for b in bounds if b > low]
    return higher[0] if higher else float("inf")


def qk_split_figure(split, n: int = 10) -> go.Figure:
    """A `qk.QKSplit` drawn: left, the score's terms (constant and positional terms apart from
    the sources' q . k); right, the `n` largest sources through the query and through the key
    (each side sums to the "q of sources · k of sources" term)."""
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, column_widths=[0.4, 0.6], horizontal_spacing=0.28,
                        subplot_titles=(f"score {split.score:+.4f}: terms",
                                        "sources through the query and through the key"))
    names = [name for name, _ in split.terms][::-1]
    values = [value for _, value in split.terms][::-1]
    fig.add_trace(go.Bar(y=names, x=values, orientation="h", showlegend=False,
                         marker_color=["#d62728" if v > 0 else "#1f77b4" for v in values],
                         hovertemplate="%{y}: %{x:+.4f}<extra></extra>"), 1, 1)
    for side, items, color in (("query", split.query, "#ff7f0e"),
                               ("key", split.key, "#2ca02c")):
        top = items[:n][::-1]
        fig.add_trace(go.Bar(y=[f"{side}: {label}" for label, _ in top],
                             x=[value for _, value in top], orientation="h",
                             name=f"through the {side}", marker_color=color,
                             hovertemplate="%{y}: %{x:+.4f}<extra></extra>"), 1, 2)
    fig.update_layout(height=220 + 22 * max(len(names), min(n, len(split.query))
                                            + min(n, len(split.key))),
                      title=f"L{split.layer}H{split.head} at query {split.query_pos}, "
                            f"key {split.key_pos}", plot_bgcolor="white", barmode="relative",
                      legend=dict(orientation="h", y=-0.15), margin=dict(l=20, r=20, t=70,
                                                                          b=40))
    return fig


def head_loadings_figure(loadings, title: str = "") -> go.Figure:
    """Heat map, layers x heads, of the |loading| each head carries summed over the split
    edges (`head_loadings.HeadLoadings`), with the bypass's share per layer in the hover."""
    mass = loadings.heads.abs().sum(0).double()                  # [n_layers n_heads]
    bypass = loadings.bypass.abs().sum(0).double()
    kind = "source head" if loadings.source_heads else "head"
    hover = [[f"L{layer} {kind} {head}: {float(mass[layer, head]):.4f}<br>bypass at L{layer}: "
              f"{float(bypass[layer]):.4f}" for head in range(mass.shape[1])]
             for layer in range(mass.shape[0])]
    fig = go.Figure(go.Heatmap(z=mass.tolist(), **scale_args(mass.numpy(), signed=False),
                               hovertext=hover, hoverinfo="text", colorbar=dict(title="|loading|"),
                               x=[f"{kind[0].upper()}{h}" for h in range(mass.shape[1])],
                               y=[f"L{layer}" for layer in range(mass.shape[0])]))
    fig.update_layout(title=title or f"head loadings over {len(loadings.targets)} edges "
                                     f"(by {kind})", height=160 + 40 * mass.shape[0],
                      margin=dict(l=40, r=20, t=60, b=40))
    return fig


__all__ = ["graph_figure", "head_loadings_figure", "node_positions", "qk_split_figure"]
