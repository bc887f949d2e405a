"""Only the page on show computes (issue 56 item 3).

Every tab's callbacks are in the app's layout, so a change of a shared control (model, prompt,
layer, head, stage) fires the callbacks of every page, shown or not: a hidden Compare ran a
2.4 s request while the user was on the explorer, and took the CPU the explorer's request
needed. A page's computing callback therefore also takes the tab (`TAB`) and remembers, in a
`drawn_store`, the inputs it last drew: `when_shown` stops it (PreventUpdate) while another tab
is shown, and when its tab comes back with the inputs it already drew; when its tab comes back
after the inputs changed, it computes then.
"""

from __future__ import annotations

import json

from dash import Input, Output, State, ctx, dcc
from dash.exceptions import PreventUpdate

TAB = Input("tabs", "value")


def drawn_id(page_id: str, what: str = "") -> str:
    return f"{page_id}-drawn{'-' + what if what else ''}"


def drawn_store(page_id: str, what: str = "") -> dcc.Store:
    """The page's memory of the inputs its callback `what` last drew (a layout component)."""
    return dcc.Store(id=drawn_id(page_id, what), data=None)


def drawn_output(page_id: str, what: str = "") -> Output:
    return Output(drawn_id(page_id, what), "data")


def drawn_state(page_id: str, what: str = "") -> State:
    return State(drawn_id(page_id, what), "data")


def when_shown(page_id: str, tab, drawn, *values) -> str:
    """The key of `values` (a callback's inputs) to keep in its drawn store. Raises
    PreventUpdate, so that nothing is computed nor sent, when `tab` is another page, and when
    the tab itself changed back to this page whose figures already show `values`."""
    if tab != page_id:
        raise PreventUpdate
    key = json.dumps(values, sort_keys=True, default=repr)
    if ctx.triggered_id == "tabs" and drawn == key:
        raise PreventUpdate
    return key
