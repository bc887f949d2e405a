"""Attention explorer for the first chosen model: a layer x head grid of thumbnails of the chosen
stage (click one to zoom), the zoomed head at full size, a click on a cell shows that query's row
and that key's column, and the zoomed head at every stage of its catalogue. Several prompts (one
per line; a text model reads all the lines as one) are averaged. Export: PNG or SVG through the
camera button, CSV of the zoomed map.

Speed (`attnlens/benchmarks/explorer.py`): the maps come from `attnlens.dashboards.map_cache` (one
forward per model and prompt); the thumbnails are ONE heatmap (tiles with NaN gutters, a click
mapped back to its head by the cell's axis labels), memoised with the maps; every figure is a
plain dict with typed float32 arrays (no plotly validation, no per-number JSON); a response
leaves out (`no_update`) the thumbnails when the browser already shows them for this prompt and
stage (`explorer-shown` remembers what it shows); the stage views come in a request of their
own, made again only for another prompt, layer or head."""

from __future__ import annotations

from dash import Input, Output, State, ctx, dcc, html, no_update, set_props
from dash.exceptions import PreventUpdate

from attnlens.dashboards.figures import (
    EXPORT_FORMATS,
    check_index,
    error_box,
    graph,
    graph_config,
    loading,
)
from attnlens.dashboards.map_cache import MAP_CACHE
from attnlens.dashboards.panels import (
    build_panel,
    mosaic_figure,
    stage_figures,
    warm_tiles,
    zoom_figure,
    zoom_table,
)
from attnlens.dashboards.visible import TAB, drawn_output, drawn_state, drawn_store, when_shown
from attnlens.interp.plots import row_column_figure
from attnlens.interp.plots.maps import mosaic_head
from attnlens.interp.tools.explore import row_and_column

TITLE = "Attention explorer"
ID = "explorer"
SHARED = [Input("ctl-models", "value"), Input("ctl-applied-prompt", "data"),
          Input("ctl-layer", "value"), Input("ctl-head", "value"), Input("ctl-stage", "value")]


def layout(store):
    return html.Div([
        html.P("The first chosen model. Thumbnails are block means of every head's map at the "
               "chosen stage; click one to zoom, click a cell of the zoomed map for its query "
               "row and key column. Signed stages use a red-blue scale centred on 0."),
        error_box("explorer-error"),
        html.Div(id="explorer-note", style={"color": "#555"}),
        dcc.Store(id="explorer-shown", data={}),
        dcc.Store(id="explorer-zoom-arrived", data=None),   # the stage views' cue
        dcc.Store(id="explorer-stages-shown", data=None),   # the stages of the stage views
        drawn_store(ID), drawn_store(ID, "stages"),
        dcc.Store(id="explorer-selected", data=None),   # the clicked query and key
        loading(graph("explorer-grid")),
        html.Div([
            html.Label("export"),
            dcc.RadioItems(list(EXPORT_FORMATS), "png", id="explorer-format", inline=True),
            html.Button("CSV of the zoomed map", id="explorer-csv", n_clicks=0),
            dcc.Download(id="explorer-download"),
        ], style={"display": "flex", "gap": "10px", "alignItems": "center"}),
        loading(graph("explorer-zoom")),
        graph("explorer-token", style={"display": "none"}),
        html.H4("The zoomed head at every stage"),
        loading(html.Div(id="explorer-stages")),
    ])


def first_model(names):
    """The explorer's model: the first chosen one (a name given alone too); None for a
    request without one (then `store.get` names what is wrong)."""
    if isinstance(names, list):
        return names[0] if names else None
    return names


def compute(store, names, text, layer, head, stage):
    """The panel, thumbnails and zoomed map of one request (the stage views: `stage_graphs`);
    raises ValueError for bad input."""
    if not names:
        raise ValueError("choose a model")
    name = first_model(names)
    panel = build_panel(store, name, text, layer, head, stage)
    grid = mosaic_figure(panel)
    warm_tiles(store, panel)          # a new prompt: every stage's tiles, once
    return panel, grid, zoom_figure(panel)


def stage_graphs(panel) -> list:
    """The zoomed head at every map stage of its layer, memoised with the maps."""
    def build() -> list:
        return [graph(f"explorer-stage-{s.name}", figure=f)
                for s, f in zip([s for s, _ in panel.view.zoom], stage_figures(panel),
                                strict=True)]

    return MAP_CACHE.memo(panel.cache_key, ("stages", panel.layer, panel.head), build)


def shown_keys(panel) -> dict:
    """What the browser shows after this response: a key for the thumbnails (prompt, stage)."""
    return {"grid": f"{hash(panel.cache_key)}|{panel.stage.name}"}


def _position(labels: list[str], value) -> int:
    """The position a click names: a token label ("3:c"), or a position number (a long map's
    windowed axes count positions); ValueError for anything else."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(labels):
        return value
    if isinstance(value, float) and value.is_integer() and 0 <= value < len(labels):
        return int(value)
    return labels.index(value)


def drawn_with(figure: dict, config: dict) -> dict:
    """A copy of `figure` (memoised: never mutated) whose layout.meta names the export format
    of `config`, so that the browser knows which format the drawn figure carries."""
    fmt = config.get("toImageButtonOptions", {}).get("format")
    if not figure or "layout" not in figure:
        return figure
    meta = {**(figure["layout"].get("meta") or {}), "export": fmt}
    return {**figure, "layout": {**figure["layout"], "meta": meta}}


def register(app, store):
    @app.callback(Output("explorer-grid", "figure"), Output("explorer-zoom", "figure"),
                  Output("explorer-zoom", "config"), Output("explorer-shown", "data"),
                  Output("explorer-error", "children"), Output("explorer-note", "children"),
                  drawn_output(ID),
                  *SHARED, TAB, State("explorer-format", "value"), State("explorer-shown", "data"),
                  drawn_state(ID))
    def _update(names, text, layer, head, stage, tab, fmt, shown, drawn):
        drawn = when_shown(ID, tab, drawn, names, text, layer, head, stage)
        try:
            panel, grid, zoom = compute(store, names, text, layer, head, stage)
            config = graph_config(panel.filename, fmt)
            zoom = drawn_with(zoom, config)
        except ValueError as err:
            return {}, {}, graph_config(), {}, str(err), "", drawn
        now = shown_keys(panel)
        shown = shown if isinstance(shown, dict) else {}
        grid = no_update if shown.get("grid") == now["grid"] else grid
        return grid, zoom, config, now, "", panel.note, drawn

    # The stage views in their own request (issue 56 item 3): the zoomed map's response no
    # longer waits for them nor carries them. That request leaves once the zoomed map's
    # figure has arrived, so the browser draws the map first: when both requests left
    # together the stage views' smaller response came first and its 2-5 graphs were drawn
    # before the map (~165 ms of a 512-token head change in headless Chromium). The browser
    # marks the figure's arrival in `explorer-zoom-arrived` (a number: the figure itself as an
    # input would be sent back to the server, 1.7 MB, beyond the request limit); the
    # controls are state. The stage views do not depend on the bar's stage nor the export
    # format: a zoom redrawn for those, their own inputs unchanged, sends nothing.
    app.clientside_callback(
        "function(figure) { return performance.now(); }",
        Output("explorer-zoom-arrived", "data"), Input("explorer-zoom", "figure"))

    # New stage views (another model or layer: other stages) come as new graphs; the same
    # stages of another head or prompt get their new figures in place (set_props): graphs that
    # come as new children are mounted anew by dash-renderer, and plotly.js drew each from
    # scratch, twice (newPlot, then the automargin redraw). `explorer-stages-shown` names the
    # stages whose graphs the page holds.
    @app.callback(Output("explorer-stages", "children"), drawn_output(ID, "stages"),
                  Output("explorer-stages-shown", "data"),
                  Input("explorer-zoom-arrived", "data"), TAB,
                  *[State(i.component_id, i.component_property) for i in SHARED[:4]],
                  State("ctl-stage", "value"), drawn_state(ID, "stages"),
                  State("explorer-stages-shown", "data"))
    def _stages(_arrived, tab, names, text, layer, head, stage, drawn, shown):
        drawn_before = drawn
        drawn = when_shown(ID, tab, drawn, names, text, layer, head)
        if ctx.triggered_id == "explorer-zoom-arrived" and drawn == drawn_before:
            raise PreventUpdate     # these stage views are drawn already
        try:
            panel = build_panel(store, first_model(names), text, layer, head, stage)
        except ValueError:
            return [], drawn, []    # the zoom's callback says what is wrong
        graphs = stage_graphs(panel)
        now = [g.id for g in graphs]
        if now != shown:
            return graphs, drawn, now
        for g in graphs:
            set_props(g.id, {"figure": g.figure})
        return no_update, drawn, no_update

    @app.callback(Output("explorer-zoom", "config", allow_duplicate=True),
                  Input("explorer-format", "value"),
                  *[State(i.component_id, i.component_property) for i in SHARED],
                  prevent_initial_call=True)
    def _format(fmt, names, _text, layer, head, stage):
        """A new export format changes only the camera button: no model run, no map sent."""
        try:
            name = first_model(names)
            model = store.get(name)
            layer = check_index("layer", layer, model.cfg.n_layers)
            head = check_index("head", head, model.cfg.n_heads)
            return graph_config(f"{name}_L{layer}H{head}_{stage}", fmt)
        except (ValueError, TypeError, IndexError):
            return no_update

    # plotly/dash#2865: dcc.Graph applies a new config only with its next figure, so the new
    # export format used to take effect after the next head change. When the config's format
    # is not the one the figure was drawn with (its layout.meta), the browser re-draws the
    # figure it holds (a shallow copy: nothing is sent to the server).
    app.clientside_callback(
        """function(config, figure) {
            const fmt = ((config || {}).toImageButtonOptions || {}).format;
            if (!figure || !figure.layout || !fmt) { return window.dash_clientside.no_update; }
            const meta = figure.layout.meta || {};
            if (meta.export === fmt) { return window.dash_clientside.no_update; }
            const layout = Object.assign({}, figure.layout,
                                         {meta: Object.assign({}, meta, {export: fmt})});
            return Object.assign({}, figure, {layout: layout});
        }""",
        Output("explorer-zoom", "figure", allow_duplicate=True),
        Input("explorer-zoom", "config"), State("explorer-zoom", "figure"),
        prevent_initial_call=True)

    # plotly.js's react keeps an axis' private `_inputRange` (relayout clears it, react does
    # not): with square cells (scaleanchor, constrain "domain") a shorter map drawn after a
    # windowed one got the window's range back, or collapsed axes ("ax.dtick error:
    # Infinity"), and stayed blank (issue 56). Once the graph holds a new figure whose axes
    # are not the ranges it asks for, a relayout to those ranges draws it as asked.
    app.clientside_callback(
        """function(figure) {
            const want = (figure && figure.layout) || {};
            const x = (want.xaxis || {}).range, y = (want.yaxis || {}).range;
            if (!x || !y || !window.Plotly) { return; }
            const title = ((want.title || {}).text) || '';
            const n = ((figure.data || [])[0] || {}).x;
            let tries = 0;
            function drawn(g) {
                return g && g._fullLayout && g._fullLayout.xaxis && g.data && g.data.length &&
                    ((g.layout.title || {}).text || '') === title &&
                    (!n || (g.data[0].x || []).length === n.length);
            }
            function check() {
                const g = document.querySelector('#explorer-zoom .js-plotly-plot');
                if (!drawn(g)) { if (++tries < 100) { setTimeout(check, 50); } return; }
                const off = (a, b) => Math.abs(a[0] - b[0]) > 1e-6 || Math.abs(a[1] - b[1]) > 1e-6;
                if (off(g._fullLayout.xaxis.range, x) || off(g._fullLayout.yaxis.range, y)) {
                    window.Plotly.relayout(g, {'xaxis.range': x.slice(), 'yaxis.range': y.slice()});
                }
            }
            setTimeout(check, 0);
        }""",
        Input("explorer-zoom", "figure"), prevent_initial_call=True)

    @app.callback(Output("ctl-layer", "value", allow_duplicate=True),
                  Output("ctl-head", "value", allow_duplicate=True),
                  Input("explorer-grid", "clickData"), State("ctl-models", "value"),
                  prevent_initial_call=True)
    def _zoom(click, names):
        """A click on a thumbnail tile zooms that (layer, head); gutters and bad data: nothing."""
        try:
            model = store.get(first_model(names))
            layer, head = mosaic_head(click["points"][0])
        except (ValueError, TypeError, KeyError, IndexError):
            return no_update, no_update
        if not (0 <= layer < model.cfg.n_layers and 0 <= head < model.cfg.n_heads):
            return no_update, no_update
        return layer, head

    @app.callback(Output("explorer-token", "figure"), Output("explorer-token", "style"),
                  Output("explorer-selected", "data"),
                  Input("explorer-zoom", "clickData"), *SHARED, TAB,
                  State("explorer-selected", "data"), prevent_initial_call=True)
    def _token(click, names, text, layer, head, stage, tab, selected):
        """A clicked cell's query row and key column. The selection belongs to the model and
        prompt it was made on: another head or stage shows the same query and key, a new
        prompt or model clears it (its positions need not exist there: issue 56). Hidden,
        the page computes nothing: it catches up when shown again."""
        if tab != ID:
            raise PreventUpdate
        hidden = {}, {"display": "none"}, None
        name = first_model(names)
        on = [name, text if isinstance(text, str) else ""]
        if ctx.triggered_id != "explorer-zoom":
            if selected is None:
                raise PreventUpdate     # nothing selected: the panel is hidden already
            if not isinstance(selected, dict) or selected.get("on") != on:
                return hidden
        try:
            panel = build_panel(store, name, text, layer, head, stage)
            if ctx.triggered_id == "explorer-zoom":
                point = click["points"][0]
                query, key = (_position(panel.labels, point["y"]),
                              _position(panel.labels, point["x"]))
            else:
                query, key = (_position(panel.labels, selected.get("query")),
                              _position(panel.labels, selected.get("key")))
        except (ValueError, TypeError, KeyError, IndexError):
            return hidden
        row, column = row_and_column(panel.zoom_map, query, key)
        figure = row_column_figure(row, column, panel.labels, query, key, panel.stage)
        return figure, {}, {"on": on, "query": query, "key": key}

    @app.callback(Output("explorer-download", "data"), Input("explorer-csv", "n_clicks"),
                  *[State(i.component_id, i.component_property) for i in SHARED],
                  prevent_initial_call=True)
    def _csv(_clicks, names, text, layer, head, stage):
        try:
            panel = build_panel(store, first_model(names), text, layer, head, stage)
        except ValueError:
            return no_update
        return dcc.send_data_frame(zoom_table(panel).to_csv, f"{panel.filename}.csv")
