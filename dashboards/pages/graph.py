"""Attribution graph: the pruned graph of the prompt on a model with transcoders
(`attnlens.interp.attribution`), a clicked feature's top contexts from the model's validation
windows and its strongest edges, and the QK side: why a head attended where it did, source by
source, with the head one click away in the explorer. Model: the bar's "one-model pages" choice;
prompt: the bar's (its first line)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import torch
from dash import Input, Output, State, ctx, dcc, html, no_update
from dash.exceptions import PreventUpdate

from attnlens.dashboards.app_links import explorer_link
from attnlens.dashboards.figures import (
    check_int,
    control_row,
    error_box,
    graph,
    loading,
    note_box,
)
from attnlens.dashboards.jobs import CANCELLED, DONE, FAILED, JobRunner
from attnlens.dashboards.store import check_text
from attnlens.interp.attribution.budget import AttributionBudget
from attnlens.interp.attribution.contexts import (
    context_windows,
    feature_activations,
    top_contexts,
    transcoders_for,
)
from attnlens.interp.attribution.graph import attribute
from attnlens.interp.attribution.head_loadings import head_loadings
from attnlens.interp.attribution.prune import prune
from attnlens.interp.attribution.qk import qk_split
from attnlens.interp.attribution.replacement import float64_copy
from attnlens.interp.plots.attribution_graph import (
    graph_figure,
    head_loadings_figure,
    qk_split_figure,
)

TITLE = "Attribution graph"
ID = "graph"
CACHED = 8
_cache: OrderedDict = OrderedDict()
_lock = threading.Lock()
# The server's budget: no graph is ever built unbounded (issue 55); one that cannot fit the
# memory budget is refused with a message before any row is computed
# (attnlens.interp.attribution.budget). Larger graphs: `attnlens graph --max-features`.
SERVER_BUDGET = AttributionBudget()
# Prompts up to this many tokens are graphed within the request; longer ones (the empty prompt
# falls back to the model's default text, 480 tokens) run in the background job queue.
SYNC_TOKENS = 64
JOBS = JobRunner(max_queued=2, keep=2)
POLL_MS = 1000


def _remember(key, make):
    with _lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
    value = make()
    with _lock:
        _cache[key] = value
        while len(_cache) > CACHED:
            _cache.popitem(last=False)
    return value


def _number(input_id, value, step, width="80px"):
    return dcc.Input(id=input_id, type="number", value=value, step=step, debounce=True,
                     style={"width": width})


def layout(store):
    return html.Div([
        html.P("The prompt's attribution graph: the MLPs replaced by the model's transcoders, "
               "attention patterns and norm scales frozen at their values on the prompt, so "
               "every edge is an exact direct effect (red raises its target, blue lowers it). "
               "Rows: token embeddings (E), each layer's features (circles, sized by influence "
               "on the output) and error nodes (grey diamonds: what the transcoders miss), "
               "the logits on top. Click a node for its top contexts and strongest edges, or "
               "pick it from the list under the plot (nodes sharing a cell sit close). "
               "Below: why a head attended from one position to another, source by source. "
               "Models without transcoders say how to train them."),
        control_row("target token", dcc.Input(id="graph-target", type="text", value="",
                                              debounce=True, placeholder="likeliest tokens",
                                              style={"width": "140px"}),
                    "node threshold", _number("graph-node-threshold", 0.8, 0.05),
                    "edge threshold", _number("graph-edge-threshold", 0.98, 0.01),
                    "edges drawn", _number("graph-max-edges", 400, 50)),
        html.Div(budget_text(), id="graph-budget", style={"fontSize": "12px", "color": "#555"}),
        html.Div([html.Span(id="graph-progress"),
                  html.Button("cancel", id="graph-cancel", n_clicks=0,
                              style={"marginLeft": "8px"})],
                 id="graph-job", style={"display": "none"}),
        dcc.Interval(id="graph-poll", interval=POLL_MS, disabled=True),
        error_box("graph-error"),
        note_box("graph-note"),
        loading([graph("graph-figure")]),
        control_row("node", dcc.Dropdown([], None, id="graph-pick", searchable=True,
                                         placeholder="pick a node (or click one above): "
                                                     "type part of its label, e.g. L1 F12",
                                         style={"minWidth": "520px"})),
        html.Div(id="graph-node", style={"fontFamily": "monospace", "fontSize": "12px"}),
        html.H4("Why did a head attend there? (QK attribution)"),
        control_row("layer", _number("graph-qk-layer", 0, 1, "60px"),
                    "head", _number("graph-qk-head", 0, 1, "60px"),
                    "query position", _number("graph-qk-query", None, 1),
                    "key position", _number("graph-qk-key", None, 1)),
        error_box("graph-qk-error"),
        loading([html.Div(id="graph-qk", style={"fontFamily": "monospace",
                                                "fontSize": "12px"})]),
    ])


def _first_line(store, name, text) -> str:
    prompt = text if isinstance(text, str) and text.strip() else store.default_text[name]
    check_text(prompt)
    if not store.reads_line_breaks.get(name, False):
        prompt = next((line for line in prompt.splitlines() if line.strip()), prompt)
    return prompt


def session(store, name):
    """(float64 model, transcoders) of store model `name` (cached)."""
    if store.get(name).cfg.attn_only:
        raise ValueError(f"{name} is attention-only: attribution graphs replace MLPs by "
                         "transcoders, so they need a model with MLPs (the zoo's -l4mlp text "
                         "models ship transcoders)")
    directory = store.directories.get(name)
    if directory is None:
        raise ValueError(f"{name} has no checkpoint directory, so no transcoders")

    def make():
        try:
            transcoders = transcoders_for(directory)
        except FileNotFoundError as err:
            raise ValueError(str(err)) from None
        return float64_copy(store.get(name)), transcoders

    return _remember(("session", name), make)


def _short(prompt: str, limit: int = 80) -> str:
    return prompt if len(prompt) <= limit else prompt[:limit - 20] + " ... " + prompt[-15:]


def budget_text(budget: AttributionBudget | None = None) -> str:
    budget = budget or SERVER_BUDGET
    cap = budget.max_feature_nodes
    return (f"Budget: at most {cap} features enter the graph, chosen by their influence on the "
            f"logits; {budget.memory} of memory for the rows, the adjacency and a batch "
            f"(float32). Prompts over {SYNC_TOKENS} tokens are graphed in the background "
            "(progress and a cancel button appear here); the note under the plot says what "
            "the budget left out.")


@dataclass
class GraphRequest:
    """A checked request: what to graph, its cache key and its length in tokens."""

    model: object
    transcoders: dict
    prompt: str
    targets: list | None
    budget: AttributionBudget
    key: tuple
    n_tokens: int

    def make(self, name, callback=None):
        return attribute(self.model, self.transcoders, self.prompt, targets=self.targets,
                         model_name=name, transcoder_set=f"{name}/transcoders",
                         budget=self.budget, dtype=torch.float32, callback=callback)


def graph_request(store, name, text, target, node_threshold, edge_threshold) -> GraphRequest:
    """Everything a graph request says, checked (ValueError naming what is wrong)."""
    model, transcoders = session(store, name)
    prompt = _first_line(store, name, text)
    targets = [check_text(target.strip(), "the target token")] \
        if isinstance(target, str) and target.strip() else None
    for label, value in (("node threshold", node_threshold), ("edge threshold", edge_threshold)):
        if isinstance(value, bool) or not isinstance(value, int | float) \
                or not 0 < value <= 1:
            raise ValueError(f"{label} must be in (0, 1], got {value!r}")
    budget = SERVER_BUDGET
    n_tokens = int(model.to_tokens(prompt).shape[1])
    key = ("graph", name, prompt, tuple(targets or ()), budget.max_feature_nodes,
           budget.memory)
    return GraphRequest(model, transcoders, prompt, targets, budget, key, n_tokens)


def finished_graph(request: GraphRequest):
    """The request's graph if it is at hand (cached, or a finished background job), else None."""
    with _lock:
        if request.key in _cache:
            return _cache[request.key]
    job = JOBS.get(request.key)
    return job.result if job is not None and job.state == DONE else None


def compute_graph(store, name, text, target, node_threshold, edge_threshold):
    """(model, transcoders, prompt, graph, pruned) of a request: a short prompt's graph is
    computed here, a long one's must have finished in the background (ValueError otherwise:
    the page submits it with `submit_graph`)."""
    request = graph_request(store, name, text, target, node_threshold, edge_threshold)
    g = finished_graph(request)
    if g is None:
        if request.n_tokens > SYNC_TOKENS:
            raise ValueError(f"the graph of this {request.n_tokens}-token prompt is being "
                             "computed in the background: wait for it above")
        g = _remember(request.key, lambda: request.make(name))
    pruned = prune(g, float(node_threshold), float(edge_threshold))
    g.node_influence = pruned.node_influence
    return request.model, request.transcoders, request.prompt, g, pruned


def submit_graph(name, request: GraphRequest):
    """The background job computing the request's graph (the existing one if any)."""
    return JOBS.submit(request.key, lambda progress: request.make(name, callback=progress))


def edges_drawn(value) -> int | None:
    """The "edges drawn" box as a number of edges, None (all) when empty or 0; ValueError for
    anything else than a whole number 0 .. MAX_EDGES."""
    if value is None or value == "":
        return None
    return check_int("edges drawn", value, 0, MAX_EDGES) or None


MAX_EDGES = 100_000


def clicked_node(click, g, pruned) -> int:
    """The node a click on the graph names (its `customdata`); ValueError for a click that
    names no drawn node (crafted or stale: a node index of another graph)."""
    try:
        index = click["points"][0]["customdata"]
    except (TypeError, KeyError, IndexError):
        raise ValueError(f"a click names a node by its index; got {click!r:.80}") from None
    return drawn_node(index, g, pruned)


def drawn_node(index, g, pruned) -> int:
    """`index` when it is a node drawn in the pruned graph; ValueError naming it otherwise."""
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < g.n_nodes \
            or not bool(pruned.node_mask[index]):
        raise ValueError(f"node {index!r:.40} is not a node drawn in this graph (the "
                         f"graph has {int(pruned.node_mask.sum())} drawn nodes among indices "
                         f"0 .. {g.n_nodes - 1}): click a node or pick one from the list")
    return index


def node_options(g, pruned) -> list[dict]:
    """Every drawn node as a dropdown option, the most influential first: crowded cells (a
    dozen features a few pixels apart) are hard to click, the list names each one."""
    kept = pruned.node_mask.nonzero().flatten().tolist()
    influence = pruned.node_influence
    kept.sort(key=lambda i: -float(influence[i]))
    return [{"label": f"{g.node_label(i)} (influence {float(influence[i]):.3f})", "value": i}
            for i in kept]


def note(g, pruned) -> str:
    kept = int(pruned.node_mask[:g.n_features].sum())
    active = g.budget.n_active if g.budget is not None else g.n_features
    left = f" {g.budget.summary()}." if g.budget is not None and g.budget.n_left_out else ""
    return (f"{g.model_name}: target {g.logit_token_strings[0]!r} (p="
            f"{float(g.logit_probabilities[0]):.3f}) of {g.n_logits} logit node(s); "
            f"{active} active features, {g.n_features} in the graph, {kept} kept, "
            f"{int(pruned.edge_mask.sum())} edges; error nodes carry {g.error_share():.1%} of "
            f"the direct effects on the target.{left}")


def node_details(store, name, model, transcoders, g, pruned, index):
    kind = g.node_kind(index)
    parts = [html.B(g.node_label(index))]
    row, column = g.adjacency[index], g.adjacency[:, index]
    for title, values in (("strongest inputs", row), ("strongest outputs", column)):
        order = values.abs().argsort(descending=True)[:6]
        items = [html.Li(f"{float(values[i]):+.4f}  {g.node_label(i)}") for i in order.tolist()
                 if values[i] != 0]
        if items:
            parts += [html.Div(title), html.Ul(items)]
    if kind in ("feature", "logit") and bool(pruned.edge_mask[index].any()):
        # which attention heads carry this node's kept inputs (head loadings, exact split)
        mask = torch.zeros_like(pruned.edge_mask)
        mask[index] = pruned.edge_mask[index]
        loads = head_loadings(model, transcoders, g, edge_mask=mask)
        parts.append(dcc.Graph(figure=head_loadings_figure(
            loads, f"heads carrying its {len(loads.targets)} kept inputs"),
            config={"displaylogo": False}))
    if kind == "feature":
        layer, _, feature = g.features[index].tolist()
        tokens = context_windows(store.directories[name])
        if tokens is not None:
            acts = _remember(("acts", name, layer),
                             lambda: feature_activations(model, transcoders[layer], tokens))
            contexts = top_contexts(model, acts, tokens, feature, n=6)
            parts += [html.Div("top contexts (validation windows)"),
                      html.Ul([html.Li([f"{c.activation:.2f}  {c.before}", html.B(c.token),
                                        c.after]) for c in contexts])]
    return parts


def qk_details(store, name, text, layer, head, query, key):
    model, transcoders = session(store, name)
    prompt = _first_line(store, name, text)
    n = model.to_tokens(prompt).shape[1]
    layer = check_int("layer", layer, 0, model.cfg.n_layers - 1, name)
    head = check_int("head", head, 0, model.cfg.n_heads - 1, name)
    query = n - 1 if query is None else check_int("query position", query, 0, n - 1)
    key = 0 if key is None else check_int("key position", key, 0, n - 1)
    split = qk_split(model, transcoders, prompt, layer, head, query, key)
    link = explorer_link(name, layer, head, "pattern", prompt)
    return [html.Div([f"L{layer}H{head} score {split.score:+.4f} at query {query}, key {key}: "
                      f"constant and positional terms apart; {len(split.query)} sources "
                      f"through the query and {len(split.key)} through the key reach it; ",
                      dcc.Link(f"open L{layer}H{head} in the explorer", href=link)]),
            dcc.Graph(figure=qk_split_figure(split), config={"displaylogo": False})]


def register(app, store):
    hidden, shown = {"display": "none"}, {"display": "block", "margin": "6px 0"}

    @app.callback(Output("graph-figure", "figure"), Output("graph-note", "children"),
                  Output("graph-error", "children"), Output("graph-pick", "options"),
                  Output("graph-pick", "value"), Output("graph-poll", "disabled"),
                  Output("graph-progress", "children"), Output("graph-job", "style"),
                  Input("ctl-model", "value"), Input("ctl-applied-prompt", "data"),
                  Input("graph-target", "value"), Input("graph-node-threshold", "value"),
                  Input("graph-edge-threshold", "value"), Input("graph-max-edges", "value"),
                  Input("tabs", "value"), Input("graph-poll", "n_intervals"),
                  Input("graph-cancel", "n_clicks"))
    def _update(name, text, target, node_threshold, edge_threshold, max_edges, tab, _poll,
                _cancel):
        """Draw the graph of the request; a long prompt's graph is a background job: queued
        (or found) here, polled by graph-poll until done, cancelled by graph-cancel."""
        if tab != ID:
            raise PreventUpdate
        trigger = ctx.triggered_id
        waiting = no_update, no_update, "", no_update, no_update
        try:
            drawn = edges_drawn(max_edges)
            with store.using(name):
                request = graph_request(store, name, text, target, node_threshold,
                                        edge_threshold)
                if request.n_tokens > SYNC_TOKENS and finished_graph(request) is None:
                    job = JOBS.get(request.key)
                    if trigger == "graph-cancel":
                        if job is not None:
                            JOBS.cancel(request.key)
                        return {}, "graph cancelled: change the prompt or a setting to " \
                            "compute it again", "", [], None, True, "", hidden
                    if job is None or (trigger != "graph-poll" and job.state != DONE):
                        job = submit_graph(name, request)
                    if job.state == FAILED:
                        return {}, "", job.error, [], None, True, "", hidden
                    if job.state != DONE:
                        if trigger == "graph-poll" and job.state == CANCELLED:
                            return *waiting, True, "cancelled", hidden
                        return (*waiting, False, f"{request.n_tokens}-token prompt: "
                                f"{job.describe()}", shown)
                _, _, prompt, g, pruned = compute_graph(store, name, text, target,
                                                        node_threshold, edge_threshold)
        except ValueError as err:
            return {}, "", str(err), [], None, True, "", hidden
        figure = graph_figure(g, pruned, title=f"{name}: {_short(prompt)!r} -> "
                                               f"{g.logit_token_strings[0]!r}", max_edges=drawn)
        return figure, note(g, pruned), "", node_options(g, pruned), None, True, "", hidden

    @app.callback(Output("graph-node", "children"), Output("graph-pick", "value",
                                                           allow_duplicate=True),
                  Input("graph-figure", "clickData"), Input("graph-pick", "value"),
                  State("ctl-model", "value"), State("ctl-applied-prompt", "data"),
                  State("graph-target", "value"), State("graph-node-threshold", "value"),
                  State("graph-edge-threshold", "value"), prevent_initial_call=True)
    def _click(click, picked, name, text, target, node_threshold, edge_threshold):
        """A node clicked in the figure or picked from the list: its details (a click also
        shows the clicked node in the list)."""
        by_list = ctx.triggered_id == "graph-pick"
        points = click.get("points") if isinstance(click, dict) else None
        if (by_list and picked is None) or (not by_list and (not click or (
                isinstance(points, list) and points and isinstance(points[0], dict)
                and "customdata" not in points[0]))):
            raise PreventUpdate     # nothing chosen yet, or an edge (edges carry no node)
        try:
            with store.using(name):
                model, transcoders, _, g, pruned = compute_graph(
                    store, name, text, target, node_threshold, edge_threshold)
                index = drawn_node(picked, g, pruned) if by_list else \
                    clicked_node(click, g, pruned)
                details = node_details(store, name, model, transcoders, g, pruned, index)
        except ValueError as err:
            return html.Div(str(err), style={"color": "#b00020"}), no_update
        return details, no_update if by_list or index == picked else index

    @app.callback(Output("graph-qk", "children"), Output("graph-qk-error", "children"),
                  Input("ctl-model", "value"), Input("ctl-applied-prompt", "data"),
                  Input("graph-qk-layer", "value"), Input("graph-qk-head", "value"),
                  Input("graph-qk-query", "value"), Input("graph-qk-key", "value"),
                  Input("tabs", "value"))
    def _qk(name, text, layer, head, query, key, tab):
        if tab != ID:
            raise PreventUpdate
        if layer is None or head is None:
            return [], "choose a layer and a head"
        try:
            with store.using(name):
                return qk_details(store, name, text, layer, head, query, key), ""
        except ValueError as err:
            return [], str(err)
