"""Gating specialization: every per-head gate of the catalogue, and Infini-attention's
memory-vs-local split of each head on the model's default input."""

from __future__ import annotations

from dash import Input, Output, dcc, html

from dashboards.figures import graph, loading
from interp.gating import gate_values
from interp.infini import CLASS_NAMES, memory_layers, memory_specialisation
from interp.plots import gate_figure, memory_figure

TITLE = "Gating"
ID = "gating"


def layout(store):
    return html.Div([
        html.P("The model is the bar's \"one-model pages\" choice.", style={"color": "#555"}),
        dcc.Input(id="gating-text", type="text", debounce=True, placeholder="input text",
                  style={"width": "100%", "marginTop": "8px"}),
        html.Div(id="gating-error", style={"color": "#b00020"}),
        loading([graph("gating-gates"), graph("gating-memory")]),
    ])


def register(app, store):
    @app.callback(Output("gating-text", "value"), Input("ctl-model", "value"))
    def _default_text(name):
        return store.default_text.get(name, "")

    @app.callback(Output("gating-gates", "figure"), Output("gating-memory", "figure"),
                  Output("gating-memory", "style"), Output("gating-error", "children"),
                  Input("ctl-model", "value"), Input("gating-text", "value"))
    def _update(name, text):
        try:
            prompt = store.prompt(name, text)
            with store.using(name) as model:
                # Infini's memory gate in the words of the memory figure below
                names = CLASS_NAMES if memory_layers(model) else None
                gates = gate_figure(gate_values(model, prompt.tokens), names)
                if not memory_layers(model):
                    return gates, {}, {"display": "none"}, prompt.note
                memory = memory_specialisation(model, prompt.tokens)
        except ValueError as err:
            return {}, {}, {"display": "none"}, str(err)
        return gates, memory_figure(memory), {}, prompt.note
