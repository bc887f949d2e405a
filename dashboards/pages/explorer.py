"""Stage-by-stage attention explorer: every map stage of the chosen layer, for one head."""

from __future__ import annotations

from dash import Input, Output, dcc, html

from dashboards.figures import stage_grid
from interp.layer_stages import layer_stage_maps

TITLE = "Stage explorer"
ID = "explorer"


def layout(store):
    first = store.names[0]
    model = store.get(first)
    return html.Div([
        html.Div([
            html.Label("model"), dcc.Dropdown(store.names, first, id="explorer-model",
                                              clearable=False, style={"width": "260px"}),
            html.Label("layer"), dcc.Dropdown(list(range(model.cfg.n_layers)), 0,
                                              id="explorer-layer", clearable=False,
                                              style={"width": "90px"}),
            html.Label("head"), dcc.Dropdown(list(range(model.cfg.n_heads)), 0,
                                             id="explorer-head", clearable=False,
                                             style={"width": "90px"}),
        ], style={"display": "flex", "gap": "10px", "alignItems": "center"}),
        dcc.Input(id="explorer-text", type="text", debounce=True, placeholder="input text",
                  value=store.default_text[first], style={"width": "100%", "marginTop": "8px"}),
        html.Div(id="explorer-error", style={"color": "#b00020", "marginTop": "6px"}),
        html.Div(id="explorer-stages", style={"marginTop": "6px", "fontSize": "13px"}),
        dcc.Loading(dcc.Graph(id="explorer-graph")),
    ])


def register(app, store):
    @app.callback(Output("explorer-layer", "options"), Output("explorer-head", "options"),
                  Output("explorer-text", "value"), Input("explorer-model", "value"))
    def _model_changed(name):
        cfg = store.get(name).cfg
        return list(range(cfg.n_layers)), list(range(cfg.n_heads)), store.default_text[name]

    @app.callback(Output("explorer-graph", "figure"), Output("explorer-error", "children"),
                  Output("explorer-stages", "children"),
                  Input("explorer-model", "value"), Input("explorer-layer", "value"),
                  Input("explorer-head", "value"), Input("explorer-text", "value"))
    def _update(name, layer, head, text):
        model = store.get(name)
        layer = min(int(layer or 0), model.cfg.n_layers - 1)
        head = min(int(head or 0), model.cfg.n_heads - 1)
        try:
            tokens, labels = store.tokens(name, text)
        except ValueError as err:
            return {}, str(err), ""
        with store.using(name):
            maps = layer_stage_maps(model, tokens, layer)
        catalogue = html.Ul([html.Li(f"hook_{s.name}: {s.description}")
                             for s in model.stages(layer)])
        return stage_grid(maps, head, labels), "", catalogue
