"""Gating specialization: every per-head gate of the catalogue, Infini-attention's
memory-vs-local split of each head, and, for CoPE (whose gates are per query-key pair, not per
head), what each head counts: its mean gate by the key token's category."""

from __future__ import annotations

from dash import Input, Output, State, ctx, dcc, html

from attnlens.dashboards.figures import graph, loading
from attnlens.dashboards.visible import TAB, drawn_output, drawn_state, drawn_store, when_shown
from attnlens.interp.plots import cope_category_figure, gate_figure, memory_figure
from attnlens.interp.tools.gating import gate_values
from attnlens.interp.variants.cope import cope_layers, gates_by_category
from attnlens.interp.variants.infini import CLASS_NAMES, memory_layers, memory_specialisation

TITLE = "Gating"
ID = "gating"
COPE_NOTE = ("CoPE's gates are one per (query, key) pair: each key's gate averaged over the "
             "queries that see it, then over the keys of each category (BOS left out); the "
             "full maps are on the Variants page.")


def layout(store):
    return html.Div([
        html.P("The model is the bar's \"one-model pages\" choice.", style={"color": "#555"}),
        html.Div([
            dcc.Textarea(id="gating-text", value="", rows=6, placeholder="input text (empty: "
                         "the model's default text); applied on leaving the box or on run",
                         style={"flex": "1", "fontFamily": "monospace"}),
            html.Button("run", id="gating-run", n_clicks=0),
        ], style={"display": "flex", "gap": "8px", "marginTop": "8px"}),
        html.Div(id="gating-error", style={"color": "#b00020"}),
        drawn_store(ID),
        loading([graph("gating-gates"), graph("gating-memory")]),
    ])


def _gates(model, tokens):
    """The per-head gate figure; for a model with no per-head gate stage but CoPE layers,
    the CoPE category view instead."""
    # Infini's memory gate in the words of the memory figure below
    table = gate_values(model, tokens)
    if len(table) or not cope_layers(model):
        return gate_figure(table, CLASS_NAMES if memory_layers(model) else None)
    fig = cope_category_figure(gates_by_category(model, tokens))
    fig.update_layout(title=dict(text="CoPE: what each head counts (mean gate by key token "
                                 f"category)<br><sup>{COPE_NOTE}</sup>"),
                      margin=dict(t=90))
    return fig


def register(app, store):
    @app.callback(Output("gating-text", "value"), Input("ctl-model", "value"))
    def _default_text(name):
        return store.default_text.get(name, "") if isinstance(name, str) else ""

    @app.callback(Output("gating-gates", "figure"), Output("gating-memory", "figure"),
                  Output("gating-memory", "style"), Output("gating-error", "children"),
                  drawn_output(ID),
                  Input("ctl-model", "value"), Input("gating-run", "n_clicks"),
                  Input("gating-text", "n_blur"), TAB, State("gating-text", "value"),
                  drawn_state(ID))
    def _update(name, clicks, blur, tab, text, drawn):
        drawn = when_shown(ID, tab, drawn, name, clicks, blur)
        return (*_draw(store, name, text), drawn)


def _draw(store, name, text):
    """The gate figures of model `name` on `text` (its default text when the model changed)."""
    if ctx.triggered_id in (None, "ctl-model", "tabs"):
        # the page's first draw, or a new model (maybe while the page was hidden) while the
        # box still holds the previous model's text: this model's default text (what the box
        # is about to show)
        text = store.default_text.get(name, "") if isinstance(name, str) else ""
    try:
        prompt = store.prompt(name, text)
        with store.using(name) as model:
            gates = _gates(model, prompt.tokens)
            if not memory_layers(model):
                return gates, {}, {"display": "none"}, prompt.note
            memory = memory_specialisation(model, prompt.tokens)
    except ValueError as err:
        return {}, {}, {"display": "none"}, str(err)
    return gates, memory_figure(memory), {}, prompt.note
