"""Circuit discovery: the circuit of the induction task found by edge attribution patching
(`attnlens.interp.circuits.discovery`) for the first chosen model, drawn layer by layer, with its
faithfulness, its top edges and a link from every head in it to the explorer."""

from __future__ import annotations

from urllib.parse import urlencode

from dash import Input, Output, dcc, html
from dash.exceptions import PreventUpdate

from attnlens.dashboards.figures import (
    check_models,
    control_row,
    error_box,
    graph,
    graph_config,
    loading,
    note_box,
    number_input,
)
from attnlens.interp.circuits.discovery import circuit_figure, discover, induction_task

TITLE = "Circuit discovery"
ID = "circuitsauto"
METHODS = ("eap-ig", "attribution")
MAX_PROMPTS = 64


def layout(store):
    return html.Div([
        html.P("The circuit of the induction task, found automatically: every edge of the "
               "model's graph (embeddings, each head's q / k / v inputs and output, MLPs, "
               "logits, and the within-layer edges of head mixing / Compose and of Infini's "
               "memory read) is scored by how much corrupting it (the first copy of [BOS] r r "
               "replaced) lowers the log-probability of the next token on the second copy; the "
               "top edges connected to the logits form the circuit. Blue: the edge carries the "
               "behaviour. Faithfulness: the circuit's metric with everything else corrupted, "
               "1 = the full model's."),
        control_row("method",
                    dcc.RadioItems([{"label": "EAP-IG (10 steps)", "value": "eap-ig"},
                                    {"label": "attribution patching (first order)",
                                     "value": "attribution"}], "eap-ig",
                                   id="circuitsauto-method", inline=True),
                    "edges", number_input("circuitsauto-topk", 20, minimum=1),
                    "prompts", number_input("circuitsauto-prompts", 16, minimum=1)),
        error_box("circuitsauto-error"),
        note_box("circuitsauto-note"),
        loading(graph("circuitsauto-graph")),
        dcc.Markdown(id="circuitsauto-links"),
    ])


def explorer_link(name: str, layer: int, head: int) -> str:
    """The deep link of the explorer on one head of model `name`."""
    return "?" + urlencode({"page": "explorer", "models": name, "layer": layer, "head": head})


def circuit_view(store, names, method: str = "eap-ig", top_k=20, prompts=16) -> tuple:
    """(figure, note, markdown links to the explorer, export stem) for the first chosen model."""
    name = check_models(store, names)[0]
    if method not in METHODS:
        raise ValueError(f"method {method!r} is not one of {list(METHODS)}")
    for label, value, top in (("edges", top_k, None), ("prompts", prompts, MAX_PROMPTS)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1 or (
                top is not None and value > top):
            bound = f" and at most {top}" if top else ""
            raise ValueError(f"{label} must be a whole number >= 1{bound}, got {value!r}")
    with store.using(name) as model:
        task = induction_task(model, n_prompts=prompts, seed=0)
        found = discover(model, task, method=method, steps=10, top_k=top_k)
    faith = found.faithfulness
    fig = circuit_figure(found.graph, found.scores, found.circuit, title=(
        f"{name}: {method} circuit, {len(found.circuit)} edges, faithfulness "
        f"{faith['faithfulness']:.2f}"))
    # The page's width, not the export's 220 px per column: a 4-layer model with MLPs (14
    # columns) would be drawn 3,000 px wide and cut off at the page's edge.
    fig.update_layout(width=None, autosize=True)
    top = found.top_edges(8)
    note = (f"{task.description}\nfaithfulness {faith['faithfulness']:.3f}: metric "
            f"{faith['clean']:.3f} (full model), {faith['circuit']:.3f} (circuit), "
            f"{faith['ablated']:.3f} (nothing)\ntop edges: " + ", ".join(
                f"{e} ({s:.3f})" for e, s in zip(top.edge, top.score, strict=True)))
    heads = sorted({(n.layer, n.head) for e in found.circuit for n in
                    (found.graph.nodes[e.src], found.graph.nodes[e.dst])
                    if n.kind == "head"})
    links = "Heads of the circuit in the explorer: " + " · ".join(
        f"[L{layer}H{head}]({explorer_link(name, layer, head)})" for layer, head in heads)
    return fig, note, links, f"{name}_circuit_{method}"


def register(app, store):
    @app.callback(Output("circuitsauto-graph", "figure"),
                  Output("circuitsauto-graph", "config"),
                  Output("circuitsauto-error", "children"),
                  Output("circuitsauto-note", "children"),
                  Output("circuitsauto-links", "children"),
                  Input("tabs", "value"), Input("ctl-models", "value"),
                  Input("circuitsauto-method", "value"), Input("circuitsauto-topk", "value"),
                  Input("circuitsauto-prompts", "value"))
    def _circuit(tab, names, method, top_k, prompts):
        if tab != ID:   # nothing computed for a hidden tab (nor at page load)
            raise PreventUpdate
        try:
            fig, note, links, stem = circuit_view(store, names, method, top_k, prompts)
        except ValueError as err:
            return {}, graph_config(), str(err), "", ""
        return fig, graph_config(stem), "", note, links
