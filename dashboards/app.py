"""The attnlens Dash app: `create_app(store)` builds it, `attnlens serve` runs it."""

from __future__ import annotations

from dash import Dash, dcc, html

from dashboards.pages import PAGES


def create_app(store) -> Dash:
    """A Dash app with one tab per page over the models in `store` (a `ModelStore`)."""
    if not store.names:
        raise ValueError("the dashboard needs at least one model")
    app = Dash(__name__, title="attnlens", suppress_callback_exceptions=True)
    app.layout = html.Div([
        html.H2("attnlens", style={"margin": "6px 0"}),
        html.Div(f"models: {', '.join(store.names)}", style={"color": "#555"}),
        dcc.Tabs(id="tabs", value=PAGES[0].ID, children=[
            dcc.Tab(label=p.TITLE, value=p.ID, children=html.Div(p.layout(store),
                                                                  style={"padding": "8px"}))
            for p in PAGES]),
    ], style={"fontFamily": "sans-serif", "margin": "0 16px"})
    for page in PAGES:
        page.register(app, store)
    return app
