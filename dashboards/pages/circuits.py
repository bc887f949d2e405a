"""Circuits: what a head does, read from its weights alone, for the first chosen model. The full
QK and OV circuits of the head of the layer / head controls over the prompt's distinct tokens,
every head's copying score, and Q / K / V composition between heads against a random baseline;
for variants that mix heads (MTA, DCMHA) the same views of the composed circuits."""

from __future__ import annotations

from dash import Input, Output, dcc, html
from dash.exceptions import PreventUpdate

from attnlens.dashboards.figures import (
    check_index,
    check_models,
    control_row,
    error_box,
    graph,
    graph_config,
    loading,
    note_box,
    number_input,
)
from attnlens.interp.circuits.composed import composed_ov, composed_qk
from attnlens.interp.circuits.qk_ov import composition_table, copying_scores
from attnlens.interp.circuits.tokens import (
    MAX_TOKENS,
    distinct_token_ids,
    has_head_mixing,
    token_circuit,
    token_labels,
)
from attnlens.interp.plots.circuits import (
    composition_vs_baseline_figure,
    copying_scores_figure,
    token_circuit_figure,
)

TITLE = "Circuits"
ID = "circuits"
CIRCUITS = ("plain", "composed", "pair")
# the page's own controls in the deep link (`attnlens.dashboards.app`): URL key -> (component,
# default)
LINK = {"circuit": ("circuits-kind", "plain"), "query": ("circuits-query", 1),
        "key": ("circuits-key", 0)}


def layout(store):
    return html.Div([
        html.P("From the weights alone (no input needed), for the first chosen model. QK: how "
               "much the head wants a query token to attend to a key token (content only, no "
               "positions). OV: if the head attends to a token, how much each output token's "
               "logit goes up (red) or down (blue). Tokens are the prompt's distinct tokens. "
               "Copying: +1 when the head raises the logit of the very token it attends to. "
               "Composition: how much an earlier head's output feeds a later head's query (Q), "
               "key (K) or value (V), minus what random matrices of the same sizes give."),
        control_row("circuits",
                    dcc.RadioItems([{"label": "each head's own", "value": "plain"},
                                    {"label": "composed by static head mixing (MTA, DCMHA)",
                                     "value": "composed"},
                                    {"label": "composed at query / key positions of the prompt "
                                              "(DCMHA's input-dependent mixing)",
                                     "value": "pair"}], LINK["circuit"][1],
                                   id="circuits-kind", inline=True),
                    "query", number_input("circuits-query", LINK["query"][1]),
                    "key", number_input("circuits-key", LINK["key"][1])),
        error_box("circuits-error"),
        note_box("circuits-note"),
        loading(html.Div([graph("circuits-qk"), graph("circuits-ov")],
                             style={"display": "flex", "gap": "12px", "flexWrap": "wrap"})),
        error_box("circuits-heads-error"),
        note_box("circuits-heads-note", pre_wrap=False),
        loading([graph("circuits-copying"), graph("circuits-composition")]),
    ])


def _composed(kind) -> bool:
    if kind not in CIRCUITS:
        raise ValueError(f"circuits {kind!r} is not one of {list(CIRCUITS)}")
    return kind != "plain"


def _mixing_note(model, name, kind: str) -> str:
    if kind == "pair":
        return (f"{name}: circuits composed by the head mixing at the chosen query and key "
                "positions of the prompt (static mixing where it does not depend on the input)")
    composed = kind == "composed"
    if composed and not has_head_mixing(model):
        return (f"{name} has no static head mixing: its composed circuits are its plain ones "
                "(choose query / key positions for input-dependent mixing, as DCMHA's)")
    if composed:
        return (f"{name}: composed circuits use the static head mixing (choose query / key "
                "positions for DCMHA's input-dependent part)")
    return ""


def token_circuits(store, names, text, layer, head, kind, query=1, key=0) -> tuple:
    """(QK figure, OV figure, note, export file stem) for the head of the first chosen model."""
    name = check_models(store, names)[0]
    model = store.get(name)
    layer = check_index("layer", layer, model.cfg.n_layers, name)
    head = check_index("head", head, model.cfg.n_heads, name)
    composed = _composed(kind)
    prompt = store.prompt(name, text)
    ids = distinct_token_ids(model, prompt.tokens[0])
    notes = [prompt.note]
    if len(ids) > MAX_TOKENS:
        notes.append(f"showing the first {MAX_TOKENS} of the prompt's {len(ids)} distinct tokens")
        ids = ids[:MAX_TOKENS]
    labels = token_labels(model, ids)
    at, where = None, ""
    if kind == "pair":
        n = prompt.tokens.shape[1]
        query = check_index("query position", query, n, f"the prompt ({n} tokens)")
        key = check_index("key position", key, query + 1, f"query {query} (causal)")
        at, where = (prompt.tokens[:1], query, key), f" at query {query}, key {key}"
    figures = []
    with store.using(name):
        for circuit in ("qk", "ov"):
            matrix = token_circuit(model, layer, head, ids, circuit, composed, at=at)
            figures.append(token_circuit_figure(matrix, labels, circuit, title=(
                f"{name} L{layer}H{head}: {'composed ' if composed else ''}"
                f"full {circuit.upper()} circuit{where}")))
    note = "; ".join(n for n in (*notes, _mixing_note(model, name, kind)) if n)
    return figures[0], figures[1], note, f"{name}_L{layer}H{head}_{kind}"


def head_tables(store, names, kind) -> tuple:
    """(copying figure, composition figure or {}, message) of the first chosen model."""
    name = check_models(store, names)[0]
    composed = _composed(kind)
    note = ("every head's table uses the static mixing: input-dependent mixing changes with "
            "the query / key pair" if kind == "pair" else "")
    with store.using(name) as model:
        ov = composed_ov(model) if composed else None
        qk = composed_qk(model) if composed else None
        copying = copying_scores_figure(copying_scores(model, ov=ov), title=(
            f"{name}: copying score of every head{' (composed OV)' if composed else ''}"))
        if model.cfg.n_layers < 2:
            return copying, {}, f"{name} has one layer: no composition between layers"
        table = composition_table(model, ov=ov, qk=qk)
    return copying, composition_vs_baseline_figure(table, title=(
        f"{name}: {'composed ' if composed else ''}composition scores minus the random "
        "baseline")), note


def register(app, store):
    @app.callback(Output("circuits-qk", "figure"), Output("circuits-ov", "figure"),
                  Output("circuits-qk", "config"), Output("circuits-ov", "config"),
                  Output("circuits-error", "children"), Output("circuits-note", "children"),
                  Input("tabs", "value"), Input("ctl-models", "value"),
                  Input("ctl-applied-prompt", "data"), Input("ctl-layer", "value"),
                  Input("ctl-head", "value"), Input("circuits-kind", "value"),
                  Input("circuits-query", "value"), Input("circuits-key", "value"))
    def _tokens(tab, names, text, layer, head, kind, query, key):
        if tab != ID:   # nothing computed for a hidden tab (nor at page load)
            raise PreventUpdate
        try:
            qk, ov, note, stem = token_circuits(store, names, text, layer, head, kind, query,
                                                key)
        except ValueError as err:
            return {}, {}, graph_config(), graph_config(), str(err), ""
        return qk, ov, graph_config(f"{stem}_qk"), graph_config(f"{stem}_ov"), "", note

    @app.callback(Output("circuits-copying", "figure"), Output("circuits-composition", "figure"),
                  Output("circuits-heads-error", "children"),
                  Output("circuits-heads-note", "children"),
                  Input("tabs", "value"), Input("ctl-models", "value"),
                  Input("circuits-kind", "value"))
    def _heads(tab, names, kind):
        if tab != ID:
            raise PreventUpdate
        try:
            copying, composition, note = head_tables(store, names, kind)
        except ValueError as err:
            return {}, {}, str(err), ""
        return copying, composition, "", note
