"""Compare: two to five models side by side on the same prompt, at the same layer, head and
stage (or, where a model lacks the stage, the stage playing the same role in its catalogue):
each model's layer x head thumbnails (ONE heatmap per model, `panels.mosaic_figure`) above its
chosen head at full size. With the scale switch on "shared" (default) the thumbnails of all
models share one colour range, and so do the zoomed heads, so that equal colours mean equal
values across the columns; on "per model" each column keeps its own range (one model's outlier,
DCMHA's +-17, no longer greys out the others). Columns wrap onto more rows."""

from __future__ import annotations

from dash import Input, Output, dcc, html

from attnlens.dashboards.figures import check_models, error_box, graph, graph_config, loading
from attnlens.dashboards.panels import build_panel, mosaic_figure, zoom_figure
from attnlens.dashboards.visible import TAB, drawn_output, drawn_state, drawn_store, when_shown
from attnlens.interp.plots.colors import colorbar_title
from attnlens.interp.plots.maps import MapScale

TITLE = "Compare models"
ID = "compare"
CELL_PX = 70        # thumbnail tile size (pixels) per head in each model's mosaic
SCALES = {"shared": "one scale for all models", "per model": "each model its own scale"}
LINK = {"scale": ("compare-scale", "shared")}
COMPARE_WINDOW = 32  # positions of a long map shown at once in a column (labels legible)
COLUMN_PX = 420     # a column's width: columns wrap onto more rows past the window's width


def layout(store):
    return html.Div([
        html.P("Each column is one model on the same prompt (tokenised by its own tokenizer). "
               "A model without the chosen stage shows its closest stage: the plain softmax for "
               "a row-stochastic stage, the logits entering the softmax for a pre-softmax one, "
               "the effective pattern otherwise. The thumbnails of all columns share one colour "
               "range, and so do the zoomed heads (red-blue around 0 when any is signed); "
               "switch to \"per model\" when one model's range hides the others'."),
        html.Div([html.Label("colour scale", style={"fontWeight": "bold"}),
                  dcc.RadioItems([{"label": v, "value": k} for k, v in SCALES.items()],
                                 LINK["scale"][1], id="compare-scale", inline=True)],
                 style={"display": "flex", "gap": "8px", "alignItems": "center"}),
        error_box("compare-error"),
        drawn_store(ID),
        loading(html.Div(id="compare-columns", style={"display": "flex", "gap": "12px",
                                                      "flexWrap": "wrap"})),
    ])


def shared_scale(figures: list[dict]) -> MapScale | None:
    """One colour scale covering every figure's own (`attnlens.interp.plots.maps.map_scale`) range:
    diverging around 0 if any is diverging (then +-the largest |value|), else sequential from 0
    to the largest top. None for no figures."""
    traces = [f["data"][0] for f in figures]
    if not traces:
        return None
    if any("zmid" in t for t in traces):
        m = max(max(abs(t["zmin"]), abs(t["zmax"])) for t in traces)
        return MapScale("diverging", -m, m)
    return MapScale("sequential", 0.0, max(t["zmax"] for t in traces))


def with_scale(figure: dict, scale: MapScale, note: str) -> dict:
    """A copy of a one-trace figure dict drawn on `scale` (the memoised original untouched)."""
    trace = {k: v for k, v in figure["data"][0].items() if k != "zmid"}
    trace.update(scale.heatmap_args())
    bar = dict(trace.get("colorbar", {}))
    text = bar.get("title", {}).get("text", "")
    bar["title"] = colorbar_title(f"{text.split('<br>')[0]} ({note})", "masked" in text)
    trace["colorbar"] = bar
    return {"data": [trace], "layout": figure["layout"]}


def compute(store, names, text, layer, head, stage, scale: str = "shared") -> list:
    """One column per model: its note or error, thumbnails and zoomed head. `scale`: "shared"
    (one colour range for all columns) or "per model". ValueError for a request that no
    column can answer (bad model list, unknown stage, unknown scale)."""
    scale = LINK["scale"][1] if scale is None else scale
    if not isinstance(scale, str) or scale not in SCALES:
        raise ValueError(f"colour scale {scale!r} is not one of {list(SCALES)}")
    names = check_models(store, names, minimum=2)
    panels = {}
    for name in names:
        try:
            panels[name] = build_panel(store, name, text, layer, head, stage, names)
        except ValueError as err:  # this model cannot answer (e.g. prompt outside its alphabet)
            panels[name] = err
    good = {n: p for n, p in panels.items() if not isinstance(p, ValueError)}
    mosaics = {n: mosaic_figure(p, cell_px=CELL_PX) for n, p in good.items()}
    zooms = {n: zoom_figure(p, window=COMPARE_WINDOW) for n, p in good.items()}
    if len(good) > 1 and scale == "shared":
        mosaic_scale = shared_scale(list(mosaics.values()))
        zoom_scale = shared_scale(list(zooms.values()))
        mosaics = {n: with_scale(f, mosaic_scale, "shared") for n, f in mosaics.items()}
        zooms = {n: with_scale(f, zoom_scale, "shared") for n, f in zooms.items()}
    columns = []
    for i, name in enumerate(names):
        children = [html.H4(name, style={"margin": "4px 0"})]
        panel = panels[name]
        if isinstance(panel, ValueError):
            children.append(html.Div(str(panel), className="compare-error",
                                     style={"color": "#b00020"}))
        else:
            children += [
                html.Div(panel.note, className="compare-note", style={"color": "#555"}),
                graph(f"compare-grid-{i}", figure=mosaics[name]),
                graph(f"compare-zoom-{i}", figure=zooms[name],
                      config=graph_config(panel.filename)),
            ]
        columns.append(html.Div(children, className="compare-column",
                                style={"flex": f"0 1 {COLUMN_PX}px",
                                       "minWidth": "300px"}))
    return columns


def register(app, store):
    @app.callback(Output("compare-columns", "children"), Output("compare-error", "children"),
                  drawn_output(ID),
                  Input("ctl-models", "value"), Input("ctl-applied-prompt", "data"),
                  Input("ctl-layer", "value"), Input("ctl-head", "value"),
                  Input("ctl-stage", "value"), Input("compare-scale", "value"), TAB,
                  drawn_state(ID))
    def _update(names, text, layer, head, stage, scale, tab, drawn):
        drawn = when_shown(ID, tab, drawn, names, text, layer, head, stage, scale)
        try:
            return compute(store, names, text, layer, head, stage, scale), "", drawn
        except ValueError as err:
            return [], str(err), drawn
