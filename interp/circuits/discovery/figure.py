"""The circuit as a plotly figure: layers left to right, nodes within a layer top to bottom.

Columns: the input, then per layer the attention heads (with sub-nodes such as a head's memory
read just left of it and the layer's shared attention input above) and the MLP, then the logits.
Residual edges are straight lines ending at the port they feed (q a little above the head, v a
little below); within-layer map edges are arcs inside the head column (pre-softmax to the right,
post-softmax to the left). Width grows with |score|; colour is the sign on the diverging scale of
`attnlens.interp.plots.colors` (blue: corrupting the edge lowers the metric, i.e. the edge carries
the behaviour; red: it raises it).

Example:
    >>> fig = circuit_figure(graph, scores, circuit, title="induction-mha")    # doctest: +SKIP
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from attnlens.interp.circuits.discovery.graph import CircuitGraph, Edge, Node
from attnlens.interp.plots.colors import DIVERGING

PORT_OFFSET = {"q": -0.22, "k": 0.0, "v": 0.22}
BLUE, RED = DIVERGING[1][1], DIVERGING[9][1]


def node_positions(graph: CircuitGraph) -> dict[str, tuple[float, float]]:
    """(x, y) of every node: x from the input (0) to the logits, y = head index (down)."""
    has_mlp = any(n.kind == "mlp" for n in graph.nodes.values())
    step = 2 if has_mlp else 1
    mid = (graph.n_heads - 1) / 2
    pos = {}
    for node in graph.nodes.values():
        if node.kind == "input":
            pos[node.name] = (0.0, mid)
        elif node.kind == "logits":
            pos[node.name] = (step * graph.n_layers + 1.0, mid)
        elif node.kind == "head":
            pos[node.name] = (step * node.layer + 1.0, float(node.head))
        elif node.kind == "mlp":
            pos[node.name] = (step * node.layer + 2.0, mid)
        elif node.kind == "attn_in":
            pos[node.name] = (step * node.layer + 1.0, -1.0)
        else:   # a per-head sub-node
            pos[node.name] = (step * node.layer + 0.65, node.head + 0.3)
    return pos


def _arc(p0, p1, bulge: float, n: int = 16) -> tuple[list[float], list[float]]:
    """A quadratic Bezier from p0 to p1 bending `bulge` to the side."""
    (x0, y0), (x1, y1) = p0, p1
    cx, cy = (x0 + x1) / 2 + bulge, (y0 + y1) / 2
    t = np.linspace(0, 1, n)
    xs = (1 - t) ** 2 * x0 + 2 * (1 - t) * t * cx + t ** 2 * x1
    ys = (1 - t) ** 2 * y0 + 2 * (1 - t) * t * cy + t ** 2 * y1
    return xs.tolist(), ys.tolist()


def _edge_path(edge: Edge, pos) -> tuple[list[float], list[float]]:
    x0, y0 = pos[edge.src]
    x1, y1 = pos[edge.dst]
    if edge.kind == "mix":
        return _arc((x0, y0), (x1, y1), 0.35 if edge.port == "pre" else -0.35)
    if edge.kind == "resid" and edge.port in PORT_OFFSET:
        return [x0, x1 - 0.12], [y0, y1 + PORT_OFFSET[edge.port]]
    return [x0, x1], [y0, y1]


def circuit_figure(graph: CircuitGraph, scores: pd.DataFrame, edges: list[Edge] | None = None,
                   title: str = "", top: int = 30) -> go.Figure:
    """The edges `edges` (default: the `top` by |score|) of `graph`, scored by `scores`
    (a table from `attnlens.interp.circuits.discovery.scoring`)."""
    by_name = dict(zip(scores.edge, scores.score, strict=True))
    if edges is None:
        index = graph.edge_index()
        order = scores.sort_values("abs_score", ascending=False, kind="stable").edge.head(top)
        edges = [graph.edges[index[n]] for n in order]
    pos = node_positions(graph)
    biggest = max([abs(by_name.get(e.name, 0.0)) for e in edges] + [1e-12])
    fig = go.Figure()
    used = {e.src for e in edges} | {e.dst for e in edges} | {"input", "logits"}
    for e in sorted(edges, key=lambda e: abs(by_name.get(e.name, 0.0))):
        value = by_name.get(e.name, 0.0)
        xs, ys = _edge_path(e, pos)
        fig.add_trace(go.Scatter(
            x=xs, y=ys, mode="lines", showlegend=False, hoverinfo="text",
            text=f"{e.name}<br>score {value:.4g} ({e.kind})",
            line=dict(width=0.5 + 7.5 * abs(value) / biggest,
                      color=BLUE if value < 0 else RED, dash="dot" if e.kind == "mix" else None),
            opacity=0.85))
    nodes: list[Node] = [n for n in graph.nodes.values()]
    fig.add_trace(go.Scatter(
        x=[pos[n.name][0] for n in nodes], y=[pos[n.name][1] for n in nodes],
        mode="markers+text", text=[n.name for n in nodes], textposition="top center",
        hoverinfo="text", showlegend=False,
        marker=dict(size=[16 if n.name in used else 8 for n in nodes],
                    color=["#444444" if n.name in used else "#c8c8c8" for n in nodes],
                    symbol=["square" if n.kind in ("input", "logits", "mlp") else "circle"
                            for n in nodes])))
    has_mlp = any(n.kind == "mlp" for n in nodes)
    step = 2 if has_mlp else 1
    ticks = [0.0] + [step * layer + 1.0 for layer in range(graph.n_layers)]
    labels = ["input"] + [f"layer {layer} attn" for layer in range(graph.n_layers)]
    if has_mlp:
        ticks += [step * layer + 2.0 for layer in range(graph.n_layers)]
        labels += [f"layer {layer} MLP" for layer in range(graph.n_layers)]
    ticks.append(step * graph.n_layers + 1.0)
    labels.append("logits")
    fig.update_layout(
        title=title or f"circuit: {len(edges)} edges (blue: carries the behaviour; dotted: "
                       "within-layer map edge)",
        xaxis=dict(title="layer", tickvals=ticks, ticktext=labels, zeroline=False,
                   showgrid=False),
        yaxis=dict(title="head", autorange="reversed", zeroline=False, showgrid=False,
                   tickvals=list(range(graph.n_heads))),
        plot_bgcolor="white", height=120 + 90 * (graph.n_heads + 1), width=max(
            600, 220 * (step * graph.n_layers + 2)))
    return fig
