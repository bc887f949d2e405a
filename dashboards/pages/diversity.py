"""Head diversity: cumulative captured variance of each layer's stacked QK and OV circuits."""

from __future__ import annotations

from dash import Input, Output, dcc, html

from attnlens.dashboards.figures import error_box, frame_table, graph, loading
from attnlens.dashboards.visible import TAB, drawn_output, drawn_state, drawn_store, when_shown
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
        drawn_store(ID),
        loading([graph("diversity-graph"), html.Div(id="diversity-summary")]),
    ])


def register(app, store):
    @app.callback(Output("diversity-graph", "figure"), Output("diversity-summary", "children"),
                  Output("diversity-error", "children"), drawn_output(ID),
                  Input("ctl-model", "value"), Input("diversity-composed", "value"), TAB,
                  drawn_state(ID))
    def _update(name, composed, tab, drawn):
        drawn = when_shown(ID, tab, drawn, name, composed)
        try:
            with store.using(name) as model:
                curves = head_diversity(model, composed=isinstance(composed, list)
                                       and "composed" in composed)
        except ValueError as err:
            return {}, "", str(err), drawn
        return diversity_figure(curves), summary_table(diversity_summary(curves)), "", drawn


def summary_table(summary) -> list:
    """`diversity_summary`'s numbers as a table: per layer and circuit, the k that captures
    90% / 95% of the variance, the mean captured share, and the random-init layer's."""
    columns = {"layer": "layer", "circuit": "circuit", "n_heads": "heads"}
    columns.update({c: c.replace("baseline_", "random init ").replace("_", " ")
                    for c in summary.columns if c not in columns})
    return [html.Div("k90, k95: principal components needed to capture 90%, 95% of the "
                     "variance; mean captured: lower is more diverse (DCMHA paper, Fig. 5)",
                     style={"color": "#555", "fontSize": "13px", "margin": "4px 0"}),
            frame_table(summary, columns, "diversity-table", bold="k90")]
