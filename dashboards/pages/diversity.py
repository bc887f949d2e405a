"""Head diversity: cumulative captured variance of each layer's stacked QK and OV circuits."""

from __future__ import annotations

from dash import Input, Output, dcc, html

from attnlens.dashboards.figures import error_box, graph, loading
from attnlens.interp.plots import diversity_figure
from attnlens.interp.tools.diversity import diversity_summary, head_diversity

TITLE = "Head diversity"
ID = "diversity"


def layout(store):
    return html.Div([
        html.Div([html.Span("model: the bar's \"one-model pages\" choice",
                            style={"color": "#555"}),
                  dcc.Checklist([{"label": " composed circuits (static head mixing)",
                                  "value": "composed"}], [], id="diversity-composed")],
                 style={"display": "flex", "gap": "10px", "alignItems": "center"}),
        html.P("How many principal components the heads of a layer need: a curve that reaches "
               "90% at small k means redundant heads (Cordonnier et al. 2020). The dashed line "
               "is a random-init layer of the same shape."),
        error_box("diversity-error"),
        loading([graph("diversity-graph"), html.Pre(id="diversity-summary")]),
    ])


def register(app, store):
    @app.callback(Output("diversity-graph", "figure"), Output("diversity-summary", "children"),
                  Output("diversity-error", "children"),
                  Input("ctl-model", "value"), Input("diversity-composed", "value"))
    def _update(name, composed):
        try:
            with store.using(name) as model:
                curves = head_diversity(model, composed=isinstance(composed, list)
                                       and "composed" in composed)
        except ValueError as err:
            return {}, "", str(err)
        return diversity_figure(curves), diversity_summary(curves).to_string(), ""
