"""The attnlens Dash app: `create_app(store)` builds it, `attnlens serve` runs it.

Layout: a bar of shared controls (models, prompt, layer, head, stage) above one tab per page
(`dashboards.pages.PAGES`). The URL's query string mirrors the tab and the shared controls, so a
link restores the view: `/?page=compare&models=a,b&layer=1&head=2&stage=pattern&prompt=...`.
"""

from __future__ import annotations

from urllib.parse import parse_qs, urlencode

from dash import Dash, Input, Output, State, ctx, dcc, html, no_update
from flask_compress import Compress

from dashboards.figures import MAX_COMPARED
from dashboards.pages import PAGES
from dashboards.store import MAX_PROMPT_CHARS
from interp.explore import map_stages

# Flask refuses larger request bodies with 413 before any callback (or tokenizer) runs.
MAX_REQUEST_BYTES = 4 * MAX_PROMPT_CHARS + 64_000
LINK_KEYS = ("page", "models", "layer", "head", "stage", "prompt")


def _stage_names(store, names) -> list[str]:
    """Map stage names of the chosen models (catalogue order, first model first)."""
    out: list[str] = []
    for name in names or []:
        if name in store.models:
            model = store.models[name]
            for layer in range(model.cfg.n_layers):
                out += [s.name for s in map_stages(model, layer) if s.name not in out]
    return out


def _controls(store) -> html.Div:
    names = store.names
    biggest = max(store.models.values(), key=lambda m: m.cfg.n_layers * m.cfg.n_heads)
    label = {"style": {"fontWeight": "bold"}}
    return html.Div([
        html.Div([
            html.Label("models", **label),
            dcc.Dropdown(names, names[:2], id="ctl-models", multi=True, clearable=False,
                         style={"minWidth": "320px"}),
            html.Label("layer", **label),
            dcc.Dropdown(list(range(biggest.cfg.n_layers)), 0, id="ctl-layer", clearable=False,
                         style={"width": "80px"}),
            html.Label("head", **label),
            dcc.Dropdown(list(range(biggest.cfg.n_heads)), 0, id="ctl-head", clearable=False,
                         style={"width": "80px"}),
            html.Label("stage", **label),
            dcc.Dropdown(_stage_names(store, names[:2]), "pattern", id="ctl-stage",
                         clearable=False, style={"width": "200px"}),
        ], style={"display": "flex", "gap": "8px", "alignItems": "center", "flexWrap": "wrap"}),
        html.Div([
            dcc.Textarea(id="ctl-prompt", value="", maxLength=MAX_PROMPT_CHARS, rows=2,
                         placeholder="prompt (empty: each model's default text; one prompt per "
                                     "line: maps averaged over them)",
                         style={"flex": "1", "fontFamily": "monospace"}),
            html.Button("run", id="ctl-run", n_clicks=0),
        ], style={"display": "flex", "gap": "8px", "marginTop": "6px"}),
        dcc.Store(id="ctl-applied-prompt", data=""),
    ], style={"padding": "6px 0", "borderBottom": "1px solid #ddd"})


def _parse_link(search: str | None) -> dict:
    """The link's values (strings; lists for models); unknown keys ignored. Values are not
    checked here: the pages check them and say what is wrong."""
    query = parse_qs((search or "").lstrip("?"), keep_blank_values=True)
    out = {k: v[-1] for k, v in query.items() if k in LINK_KEYS}
    if "models" in out:
        out["models"] = [m for m in out["models"].split(",") if m]
    for key in ("layer", "head"):
        if key in out and out[key].strip().isdigit():
            out[key] = int(out[key])
    return out


def make_link(page, models, layer, head, stage, prompt) -> str:
    """The query string of a view (inverse of `_parse_link`)."""
    values = {"page": page, "models": ",".join(models or []), "layer": layer, "head": head,
              "stage": stage, "prompt": prompt or ""}
    return "?" + urlencode({k: "" if v is None else v for k, v in values.items()})


def _register_shared(app: Dash, store) -> None:
    @app.callback(Output("ctl-applied-prompt", "data", allow_duplicate=True),
                  Input("ctl-run", "n_clicks"), Input("ctl-prompt", "n_blur"),
                  State("ctl-prompt", "value"), State("ctl-applied-prompt", "data"),
                  prevent_initial_call=True)
    def _apply_prompt(_clicks, _blur, text, applied):
        return no_update if text == applied else (text or "")

    @app.callback(Output("ctl-layer", "options"), Output("ctl-head", "options"),
                  Output("ctl-stage", "options"), Input("ctl-models", "value"))
    def _options(names):
        models = [store.models[n] for n in (names or []) if n in store.models]
        if not models:
            return [], [], []
        layers = max(m.cfg.n_layers for m in models)
        heads = max(m.cfg.n_heads for m in models)
        return list(range(layers)), list(range(heads)), _stage_names(store, names)

    outputs = ["tabs.value", "ctl-models.value", "ctl-applied-prompt.data", "ctl-layer.value",
               "ctl-head.value", "ctl-stage.value"]

    @app.callback(Output("url", "search"),
                  *[Output(*o.split(".")) for o in outputs],
                  Output("ctl-prompt", "value"),
                  Input("url", "search"), *[Input(*o.split(".")) for o in outputs])
    def _sync_link(search, page, models, prompt, layer, head, stage):
        current = dict(page=page, models=models, prompt=prompt, layer=layer, head=head,
                       stage=stage)
        if ctx.triggered_id in (None, "url"):
            link = _parse_link(search)
            if not link:
                return (no_update,) * 8
            new = [link.get(k, current[k]) for k in ("page", "models", "prompt", "layer",
                                                     "head", "stage")]
            old = [current[k] for k in ("page", "models", "prompt", "layer", "head", "stage")]
            changed = [n if n != o else no_update for n, o in zip(new, old, strict=True)]
            text = link.get("prompt", no_update)
            return (no_update, *changed, text)
        search_now = make_link(page, models, layer, head, stage, prompt)
        return (no_update if search_now == search else search_now,) + (no_update,) * 7


def create_app(store) -> Dash:
    """A Dash app with one tab per page over the models in `store` (a `ModelStore`)."""
    if not store.names:
        raise ValueError("the dashboard needs at least one model")
    app = Dash(__name__, title="attnlens", suppress_callback_exceptions=True)
    app.server.config["MAX_CONTENT_LENGTH"] = MAX_REQUEST_BYTES
    # Responses compressed (the browser asks for zstd or gzip): a map's masked half is NaN
    # and compresses to nothing; level 1 costs a few ms (dashboards/benchmarks/explorer.py).
    app.server.config.update(COMPRESS_ALGORITHM=["zstd", "gzip"], COMPRESS_ZSTD_LEVEL=1,
                             COMPRESS_LEVEL=1)
    Compress(app.server)
    app.layout = html.Div([
        dcc.Location(id="url", refresh=False),
        html.H2("attnlens", style={"margin": "6px 0"}),
        html.Div(f"models: {', '.join(store.names)} (compare up to {MAX_COMPARED})",
                 style={"color": "#555"}),
        _controls(store),
        dcc.Tabs(id="tabs", value=PAGES[0].ID, children=[
            dcc.Tab(label=p.TITLE, value=p.ID, children=html.Div(p.layout(store),
                                                                  style={"padding": "8px"}))
            for p in PAGES]),
    ], style={"fontFamily": "sans-serif", "margin": "0 16px"})
    _register_shared(app, store)
    for page in PAGES:
        page.register(app, store)
    return app
