"""Compare: two to five models side by side on the same prompt, at the same layer, head and
stage (or, where a model lacks the stage, the stage playing the same role in its catalogue):
each model's layer x head thumbnails above its chosen head at full size."""

from __future__ import annotations

from dash import Input, Output, html

from dashboards.figures import check_models, error_box, graph, graph_config
from dashboards.panels import build_panel, thumbnails_figure, wanted_stage, zoom_figure

TITLE = "Compare models"
ID = "compare"


def layout(store):
    return html.Div([
        html.P("Each column is one model on the same prompt (tokenised by its own tokenizer). "
               "A model without the chosen stage shows its closest stage: the plain softmax for "
               "a row-stochastic stage, the logits entering the softmax for a pre-softmax one, "
               "the effective pattern otherwise."),
        error_box("compare-error"),
        html.Div(id="compare-columns", style={"display": "flex", "gap": "12px",
                                              "overflowX": "auto"}),
    ])


def compute(store, names, text, layer, head, stage) -> list:
    """One column per model: its note or error, thumbnails and zoomed head. ValueError for a
    request that no column can answer (bad model list, unknown stage)."""
    names = check_models(store, names, minimum=2)
    wanted = wanted_stage(store, names, stage)
    columns = []
    for i, name in enumerate(names):
        children = [html.H4(name, style={"margin": "4px 0"})]
        try:
            panel = build_panel(store, name, text, layer, head, stage, closest=wanted)
        except ValueError as err:  # this model cannot answer (e.g. prompt outside its alphabet)
            children.append(html.Div(str(err), className="compare-error",
                                     style={"color": "#b00020"}))
        else:
            children += [
                html.Div(panel.note, className="compare-note", style={"color": "#555"}),
                graph(f"compare-grid-{i}", figure=thumbnails_figure(panel, cell_px=70)),
                graph(f"compare-zoom-{i}", figure=zoom_figure(panel),
                      config=graph_config(panel.filename)),
            ]
        columns.append(html.Div(children, className="compare-column",
                                style={"flex": f"1 0 {max(300, 900 // len(names))}px"}))
    return columns


def register(app, store):
    @app.callback(Output("compare-columns", "children"), Output("compare-error", "children"),
                  Input("ctl-models", "value"), Input("ctl-applied-prompt", "data"),
                  Input("ctl-layer", "value"), Input("ctl-head", "value"),
                  Input("ctl-stage", "value"))
    def _update(names, text, layer, head, stage):
        try:
            return compute(store, names, text, layer, head, stage), ""
        except ValueError as err:
            return [], str(err)
