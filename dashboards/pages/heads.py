"""Induction-head study: previous-token, duplicate-token and induction scores of every head,
on any map stage of the catalogue, with a knock-out check."""

from __future__ import annotations

from dash import Input, Output, dcc, html, no_update

from dashboards.figures import error_box, graph
from interp import heads
from interp._common import map_stage_names
from interp.plots import head_table_figure

TITLE = "Induction heads"
ID = "heads"
SCORES = ["previous_token", "induction_stripe", "induction", "duplicate_token"]


def layout(store):
    first = store.names[0]
    return html.Div([
        html.Div([html.Label("model"),
                  dcc.Dropdown(store.names, first, id="heads-model", clearable=False,
                               style={"width": "260px"}),
                  html.Label("stage"),
                  dcc.Dropdown(map_stage_names(store.get(first)), "pattern", id="heads-stage",
                               clearable=False, style={"width": "200px"})],
                 style={"display": "flex", "gap": "10px", "alignItems": "center"}),
        html.P("Mean attention mass of each head on the previous token, on the induction stripe "
               "of repeated random tokens ([BOS] r r), on tokens that followed earlier copies "
               "(prefix matching) and on earlier copies of the current token. Stages after "
               "cross-head mixing are not probability distributions, so scores can leave [0, 1]."),
        error_box("heads-error"),
        dcc.Loading(graph("heads-graph")),
    ])


def register(app, store):
    @app.callback(Output("heads-stage", "options"), Output("heads-stage", "value"),
                  Input("heads-model", "value"))
    def _stages(name):
        if name not in store.models:
            return no_update, no_update
        return map_stage_names(store.get(name)), "pattern"

    @app.callback(Output("heads-graph", "figure"), Output("heads-error", "children"),
                  Input("heads-model", "value"), Input("heads-stage", "value"))
    def _update(name, stage):
        try:
            model = store.get(name)
            if stage not in map_stage_names(model):  # never a silently different stage
                raise ValueError(f"stage {stage!r} is not a map stage of {name}; allowed: "
                                 f"{map_stage_names(model)}")
            with store.using(name):
                table = heads.induction_table(model, batch=16, stage=stage)
        except ValueError as err:
            return {}, str(err)
        return head_table_figure(table, SCORES, title=f"{name}: hook_{stage}"), ""
