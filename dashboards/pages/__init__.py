"""Dashboard pages, in tab order. To add a page, write a module here with

    TITLE: str                  the tab's label
    ID: str                     the tab's value and the `page=` of deep links
    layout(store) -> component  built once at start-up: cheap (no forward pass)
    register(app, store)        its callbacks; ids prefixed with ID ("explorer-zoom")

and append it to PAGES. A page reads the shared controls (`ctl-models`, `ctl-applied-prompt`,
`ctl-layer`, `ctl-head`, `ctl-stage`; see dashboards/app.py) as callback Inputs or keeps its
own; a callback that computes takes the tab too and does nothing while its page is hidden
(`attnlens.dashboards.visible.when_shown`). It calls interp for numbers and
attnlens.interp.plots for figures, checks request values with `attnlens.dashboards.figures` /
`attnlens.dashboards.panels.build_panel`, and shows a ValueError's message in the page instead
of raising.
"""

from attnlens.dashboards.pages import (
    attribution,
    circuits,
    circuits_auto,
    compare,
    diversity,
    explorer,
    gating,
    graph,
    heads,
    outputs,
    tokens,
    variants,
)

PAGES = [compare, explorer, tokens, outputs, attribution, graph, heads, circuits, circuits_auto,
         variants, diversity, gating]
