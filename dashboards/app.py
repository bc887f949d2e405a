"""The attnlens Dash app: `create_app(store)` builds it, `attnlens serve` runs it.

Layout: a bar of shared controls (models, prompt, layer, head, stage) above one tab per page
(`attnlens.dashboards.pages.PAGES`). The URL's query string mirrors the tab and the shared controls,
so a link restores the view: `/?page=compare&models=a,b&layer=1&head=2&stage=pattern&prompt=...`;
`&model=c` names the one-model pages' model when it is not the first of `models` (which it
follows by default).
A page's own controls (its `LINK` table: URL key -> (component id, default)) join the link when
they differ from their defaults, e.g. `&circuit=pair&query=3&key=1`; a link without them (older
links) leaves them as they are.
"""

from __future__ import annotations

from urllib.parse import parse_qs, urlencode

from dash import Dash, Input, Output, State, ctx, dcc, html, no_update, set_props
from dash.exceptions import PreventUpdate
from flask_compress import Compress

from attnlens.dashboards import graph_pick
from attnlens.dashboards.figures import MAX_COMPARED, error_box
from attnlens.dashboards.guards import APP_ERROR, guard_envelopes, on_callback_error
from attnlens.dashboards.pages import PAGES
from attnlens.dashboards.store import MAX_PROMPT_CHARS, check_text
from attnlens.interp.tools.explore import map_stages

# Flask refuses larger request bodies with 413 before any callback (or tokenizer) runs.
MAX_REQUEST_BYTES = 4 * MAX_PROMPT_CHARS + 64_000
SHARED_KEYS = ("page", "models", "layer", "head", "stage", "prompt", "model")


def _page_links() -> dict[str, tuple[str, object]]:
    """Every page's own linked controls: URL key -> (component id, default value)."""
    out: dict[str, tuple[str, object]] = {}
    for page in PAGES:
        for key, spec in getattr(page, "LINK", {}).items():
            if key in SHARED_KEYS or key in out:
                raise ValueError(f"deep-link key {key!r} of page {page.ID!r} is taken")
            out[key] = spec
    return out


PAGE_LINKS = _page_links()
LINK_KEYS = SHARED_KEYS + tuple(PAGE_LINKS)


def _stage_names(store, names) -> list[str]:
    """Map stage names of the chosen models (catalogue order, first model first)."""
    out: list[str] = []
    for name in names if isinstance(names, list) else []:
        if isinstance(name, str) and name in store.models:
            model = store.models[name]
            for layer in range(model.cfg.n_layers):
                out += [s.name for s in map_stages(model, layer) if s.name not in out]
    return out


def _options(store, names) -> tuple[list, list, list]:
    """Options of the layer, head and stage dropdowns: every layer, head and map stage of every
    model in the store, those none of the chosen `names` has greyed out (disabled).

    Never fewer: a dropdown drops a value that is not among its options, and a link sets the
    models and the stage at once, so a stage of the linked model must be an option before the
    models arrive (issue 49). A page shows the closest view when the chosen model lacks one
    (`attnlens.dashboards.panels.choose_view`).
    """
    names = names if isinstance(names, list) else []
    chosen = [store.models[n] for n in names if isinstance(n, str) and n in store.models]
    everything = list(store.models.values())

    def numbers(size) -> list[dict]:
        most = max((size(m) for m in chosen), default=0)
        return [{"label": str(i), "value": i, "disabled": i >= most}
                for i in range(max(size(m) for m in everything))]

    mine = _stage_names(store, names)
    others = [s for s in _stage_names(store, store.names) if s not in mine]
    stages = [{"label": s, "value": s} for s in mine] + [
        {"label": f"{s} (other models)", "value": s, "disabled": True} for s in others]
    return (numbers(lambda m: m.cfg.n_layers), numbers(lambda m: m.cfg.n_heads), stages)


def _controls(store) -> html.Div:
    names = store.names
    layers, heads, stages = _options(store, names[:2])
    label = {"style": {"fontWeight": "bold"}}
    return html.Div([
        html.Div([
            html.Label("models", **label),
            dcc.Dropdown(names, names[:2], id="ctl-models", multi=True, clearable=False,
                         style={"minWidth": "320px"}),
            html.Label("layer", **label),
            dcc.Dropdown(layers, 0, id="ctl-layer", clearable=False,
                         style={"width": "80px"}),
            html.Label("head", **label),
            dcc.Dropdown(heads, 0, id="ctl-head", clearable=False,
                         style={"width": "80px"}),
            html.Label("stage", **label),
            dcc.Dropdown(stages, "pattern", id="ctl-stage",
                         clearable=False, style={"width": "200px"}),
            # the one model of the one-model pages (Variants, Diversity, Gating)
            html.Label("one-model pages", **label, title="the model of Variants, Diversity "
                       "and Gating"),
            dcc.Dropdown(names, names[0], id="ctl-model", clearable=False,
                         style={"minWidth": "220px"}),
        ], style={"display": "flex", "gap": "8px", "alignItems": "center", "flexWrap": "wrap"}),
        html.Div([
            dcc.Textarea(id="ctl-prompt", value="", maxLength=MAX_PROMPT_CHARS, rows=2,
                         placeholder="prompt (empty: each model's default text; one prompt per "
                                     "line, maps averaged over them; a text model reads all the "
                                     "lines as one prompt)",
                         style={"flex": "1", "fontFamily": "monospace"}),
            html.Button("run", id="ctl-run", n_clicks=0),
        ], style={"display": "flex", "gap": "8px", "marginTop": "6px"}),
        dcc.Store(id="ctl-applied-prompt", data=""),
    ], style={"padding": "6px 0", "borderBottom": "1px solid #ddd"})


MAX_LINK_INT = 2 ** 53 - 1   # larger numbers stay text (JSON and the browser lose them)


def _link_int(text: str):
    """`text` as an int when it is plain ASCII digits of a number the browser keeps exactly,
    else `text` unchanged (the page or `_check_link` names it)."""
    digits = text.strip()
    if digits.isascii() and digits.isdigit() and int(digits) <= MAX_LINK_INT:
        return int(digits)
    return text


def _parse_link(search: str | None) -> dict:
    """The link's values (strings; lists for models); unknown keys ignored. Values are not
    checked here: `_check_link` and the pages check them and say what is wrong."""
    if not isinstance(search, str):
        return {}
    query = parse_qs(search.lstrip("?"), keep_blank_values=True)
    out = {k: v[-1] for k, v in query.items() if k in LINK_KEYS}
    if "models" in out:
        out["models"] = [m for m in out["models"].split(",") if m]
    numeric = ["layer", "head"] + [k for k, (_, d) in PAGE_LINKS.items() if type(d) is int]
    for key in numeric:
        if key in out:
            out[key] = _link_int(out[key])
    return out


def _check_link(store, link: dict) -> tuple[dict, list[str]]:
    """`link` without the shared values the controls cannot show (a page, model, layer, head or
    stage no model here has), and a sentence for each; the rest of the link still applies. An
    unknown page falls back to the first page."""
    link, notes = dict(link), []
    pages = [p.ID for p in PAGES]
    if "page" in link and link["page"] not in pages:
        notes.append(f"page {link['page']!r} is not a page of this dashboard "
                     f"({', '.join(pages)}): showing {PAGES[0].TITLE}")
        link["page"] = pages[0]
    if "models" in link:
        unknown = [m for m in link["models"] if m not in store.models]
        if unknown:
            notes.append(f"unknown model(s) {', '.join(map(repr, unknown))}; available: "
                         f"{', '.join(store.names)}")
        link["models"] = [m for m in link["models"] if m in store.models]
        if not link["models"]:
            del link["models"]
    if "model" in link and link["model"] not in store.models:
        notes.append(f"unknown model {link['model']!r} for the one-model pages; available: "
                     f"{', '.join(store.names)}")
        del link["model"]
    models = list(store.models.values())
    for key, size in (("layer", max(m.cfg.n_layers for m in models)),
                      ("head", max(m.cfg.n_heads for m in models))):
        value = link.get(key)
        if key in link and (isinstance(value, bool) or not isinstance(value, int)
                            or not 0 <= value < size):
            notes.append(f"{key} {value} is not a {key} of these models ({key}s 0 .. "
                         f"{size - 1}): the {key} is left as it was")
            del link[key]
    if "stage" in link and link["stage"] not in _stage_names(store, store.names):
        notes.append(f"stage {link['stage']!r} is not a map stage of these models: the stage "
                     "is left as it was")
        del link["stage"]
    return link, notes


def make_link(page, models, layer, head, stage, prompt, controls: dict | None = None,
              model: str | None = None) -> str:
    """The query string of a view (inverse of `_parse_link`). `controls`: the pages' own
    controls by URL key; those at their default (or None, an emptied number box) are left out.
    `model`: the one-model pages' model, left out when it is the first of `models` (the model
    it follows)."""
    values = {"page": page, "models": ",".join(models or []), "layer": layer, "head": head,
              "stage": stage, "prompt": prompt or ""}
    values = {k: "" if v is None else v for k, v in values.items()}
    if model and model != (list(models or []) or [None])[0]:
        values["model"] = model
    for key, value in (controls or {}).items():
        if key not in PAGE_LINKS:
            raise ValueError(f"{key!r} is not a linked control; known: {sorted(PAGE_LINKS)}")
        if value is not None and value != PAGE_LINKS[key][1]:
            values[key] = value
    # a lone surrogate (no UTF-8 for it) would fail the whole link: it is written as "?"
    return "?" + urlencode(values, errors="replace")


def _register_shared(app: Dash, store) -> None:
    @app.callback(Output("ctl-applied-prompt", "data", allow_duplicate=True),
                  Input("ctl-run", "n_clicks"), Input("ctl-prompt", "n_blur"),
                  State("ctl-prompt", "value"), State("ctl-applied-prompt", "data"),
                  prevent_initial_call=True)
    def _apply_prompt(_clicks, _blur, text, applied):
        if text is not None and not isinstance(text, str):
            return no_update                       # a crafted request: no prompt in it
        text = text or ""
        try:
            check_text(text)
        except ValueError as err:   # no tokenizer reads it, and no response could carry it
            set_props(APP_ERROR, {"children": f"{err}; it is replaced by U+FFFD"})
            text = "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in text)
        return no_update if text == applied else text

    @app.callback(Output("ctl-layer", "options"), Output("ctl-head", "options"),
                  Output("ctl-stage", "options"), Input("ctl-models", "value"))
    def _chosen_options(names):
        return _options(store, names)

    # URL key and component property of every linked control, shared ones first
    linked = [("page", "tabs.value"), ("models", "ctl-models.value"),
              ("prompt", "ctl-applied-prompt.data"), ("layer", "ctl-layer.value"),
              ("head", "ctl-head.value"), ("stage", "ctl-stage.value"),
              ("model", "ctl-model.value"),
              *[(key, f"{cid}.value") for key, (cid, _) in PAGE_LINKS.items()]]
    keys = [k for k, _ in linked]

    def first(names):
        """The model the one-model pages follow: the first chosen one, if known."""
        if isinstance(names, list) and names and isinstance(names[0], str) \
                and names[0] in store.models:
            return names[0]
        return None

    # Issue 56 item 3: this callback's outputs are the controls, so dash-renderer holds back
    # every callback that reads a control while it runs: when the controls were its inputs
    # too (one callback for both directions), a head change waited 20-120 ms for it before
    # the explorer's request left. It runs for the URL only (a link, back / forward; the
    # controls are its state); `_view_link` and the clientside push below keep the URL in
    # step with the view without holding anything back. (`url.search` stays its first
    # output, never changed: the callback is known by it.)
    @app.callback(Output("url", "search"),
                  *[Output(*o.split(".")) for _, o in linked],
                  Output("ctl-prompt", "value"), Output("link-note", "children"),
                  Output("link-applied", "data"),
                  Input("url", "search"), *[State(*o.split(".")) for _, o in linked],
                  State("link-note", "children"))
    def _sync_link(search, *values):
        """URL -> controls (a link). The one-model pages' model follows the first chosen model
        (a link's `models=` too) unless the link names it (`model=`); the user may pick
        another one, and the link keeps it. The URL the view itself pushed (`_view_link`)
        changes nothing."""
        *values, note = values
        current = dict(zip(keys, values, strict=True))
        if ctx.triggered_id == "url" and search and search == _search_of(current, None):
            raise PreventUpdate
        link, notes = _check_link(store, _parse_link(search))
        note = f"This link: {'; '.join(notes)}." if notes else ""
        if not link:
            return (no_update,) * (len(keys) + 2) + (note, no_update)
        if "model" not in link and first(link.get("models")):
            link["model"] = first(link["models"])
        changed = [link[k] if k in link and link[k] != current[k] else no_update
                   for k in keys]
        text = link.get("prompt", no_update)
        applied = _search_of({**current, **{k: link[k] for k in keys if k in link}}, None)
        return (no_update, *changed, text, note, applied)

    def _search_of(current: dict, fallback):
        """The query string of the view the controls `current` show (`fallback` for a crafted
        value no link can hold)."""
        try:
            return make_link(*[current[k] for k in SHARED_KEYS if k != "model"],
                             controls={k: current[k] for k in PAGE_LINKS},
                             model=current["model"])
        except (ValueError, TypeError):
            return fallback

    @app.callback(Output("link-wanted", "data"),
                  Output("ctl-model", "value", allow_duplicate=True),
                  Output("link-note", "children", allow_duplicate=True),
                  *[Input(*o.split(".")) for _, o in linked],
                  State("link-note", "children"), State("link-applied", "data"),
                  prevent_initial_call=True)
    def _view_link(*values):
        """The view changed: its query string for the browser's history (replacing the entry
        while the view is the link's own, e.g. a link completed by its defaults), the one-model
        pages' model following a new first chosen model, the link's note cleared (old news
        once the user changed the view). Outputs no control the pages read but the one-model
        pages' model, so that their requests go at once."""
        *values, note, applied = values
        current = dict(zip(keys, values, strict=True))
        follow = no_update
        if ctx.triggered_id == "ctl-models" and first(current["models"]) \
                and first(current["models"]) != current["model"]:
            follow = current["model"] = first(current["models"])
        search = _search_of(current, None)     # None: a crafted value no link can hold
        own = search is not None and search == applied
        note = "" if note and not own and ctx.triggered_id in (
            "tabs", "ctl-models", "ctl-layer", "ctl-head", "ctl-stage", "ctl-model") \
            else no_update
        wanted = no_update if search is None else {"search": search, "replace": own}
        return wanted, follow, note

    app.clientside_callback(
        """function(wanted) {
            if (!wanted || typeof wanted.search !== 'string') { return ''; }
            if (window.location.search !== wanted.search) {
                const url = window.location.pathname + wanted.search + window.location.hash;
                if (wanted.replace) { window.history.replaceState({}, '', url); }
                else { window.history.pushState({}, '', url); }
                // dcc.Location reads the URL again (its `search`, for back / forward) once
                // this change's requests are on their way; `_sync_link` then does nothing
                setTimeout(() => window.dispatchEvent(
                    new CustomEvent('_dashprivate_pushstate')), 0);
            }
            return '';
        }""",
        Output("link-pushed", "data"), Input("link-wanted", "data"), prevent_initial_call=True)

    @app.callback(Output(APP_ERROR, "children"), Input("tabs", "value"),
                  Input("ctl-models", "value"), Input("ctl-layer", "value"),
                  Input("ctl-head", "value"), Input("ctl-stage", "value"),
                  Input("ctl-model", "value"),
                  State(APP_ERROR, "children"), prevent_initial_call=True)
    def _clear_app_error(*values):
        """Another view chosen: the error of an earlier request is old news (not on a new
        prompt: applying one may be what raised it)."""
        return "" if values[-1] else no_update


LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")


def served_hosts(host: str | None = None) -> set[str]:
    """The Host header names the server answers: the loopback names and the configured host
    (for a wildcard address, this machine's names). Anything else (DNS rebinding: a foreign
    page whose name resolves to this machine) is refused with 403."""
    import socket

    names = set(LOCAL_HOSTS)
    if host:
        names.add(host.strip("[]").lower())
    if host in ("0.0.0.0", "::", ""):
        names |= {socket.gethostname().lower(), socket.getfqdn().lower()}
    return names


def _host_name(header: str) -> str:
    """The name of a Host header without its port ("[::1]:8050" -> "::1")."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def _guard_hosts(app: Dash, hosts: set[str]) -> None:
    from flask import abort, request

    @app.server.before_request
    def _check_host():
        if _host_name(request.headers.get("Host", "")) not in hosts:
            abort(403, description="this attnlens dashboard does not serve that host name")


def create_app(store, host: str | None = None) -> Dash:
    """A Dash app with one tab per page over the models in `store` (a `ModelStore`).
    `host`: the address it is served on (`attnlens serve --host`); requests whose Host header
    names another host are refused (`served_hosts`)."""
    if not store.names:
        raise ValueError("the dashboard needs at least one model")
    app = Dash(__name__, title="attnlens", suppress_callback_exceptions=True,
               on_error=on_callback_error)
    _guard_hosts(app, served_hosts(host))
    guard_envelopes(app)
    app.server.config["MAX_CONTENT_LENGTH"] = MAX_REQUEST_BYTES
    # Responses compressed (the browser asks for zstd or gzip): a map's masked half is NaN
    # and compresses to nothing; level 1 costs a few ms (attnlens/benchmarks/explorer.py).
    app.server.config.update(COMPRESS_ALGORITHM=["zstd", "gzip"], COMPRESS_ZSTD_LEVEL=1,
                             COMPRESS_LEVEL=1)
    Compress(app.server)
    app.layout = html.Div([
        dcc.Location(id="url", refresh=False),
        html.H2("attnlens", style={"margin": "6px 0"}),
        html.Div(f"models: {', '.join(store.names)} (compare up to {MAX_COMPARED})",
                 style={"color": "#555"}),
        _controls(store),
        error_box("link-note"),      # what a link asked for that this dashboard cannot show
        dcc.Store(id="link-applied"), dcc.Store(id="link-wanted"), dcc.Store(id="link-pushed"),
        error_box(APP_ERROR),        # a request the server could not answer (guards.py)
        dcc.Tabs(id="tabs", value=PAGES[0].ID, children=[
            dcc.Tab(label=p.TITLE, value=p.ID, children=html.Div(p.layout(store),
                                                                  style={"padding": "8px"}))
            for p in PAGES]),
    ], style={"fontFamily": "sans-serif", "margin": "0 16px"})
    _register_shared(app, store)
    for page in PAGES:
        page.register(app, store)
    graph_pick.register(app)       # the Attribution graph's picked node, marked in its figure
    return app
