"""Dashboard pages: each module has TITLE, ID, `layout(store)` and `register(app, store)`."""

from dashboards.pages import diversity, explorer, gating, heads

PAGES = [explorer, heads, diversity, gating]
