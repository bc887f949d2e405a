"""Dashboard pages: each module has TITLE, `layout(store)` and `register(app, store)`."""

from dashboards.pages import explorer, heads

PAGES = [explorer, heads]
