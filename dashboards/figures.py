"""Dashboard building blocks around the figures of `attnlens.interp.plots`: graph components with
the export settings, the pages' small layout pieces (control rows, number inputs, error and note
boxes), and the checks that turn request values into indices (the page boundary).

Request values arrive from the browser and can be crafted: every callback validates them here
and shows the ValueError's message in the page, never a 500 nor a silently different head.
"""

from __future__ import annotations

import re

from dash import dcc, html

MAX_COMPARED = 5
EXPORT_FORMATS = ("png", "svg")


def graph_config(filename: str = "attnlens", fmt: str = "png") -> dict:
    """plotly config: no "share to cloud" / Chart Studio buttons, no logo, and the camera button
    exporting `filename`.`fmt` (the whole figure, colour bar included) at 2x scale."""
    if fmt not in EXPORT_FORMATS:
        raise ValueError(f"export format {fmt!r} is not one of {EXPORT_FORMATS}")
    return {"displaylogo": False, "showSendToCloud": False, "showEditInChartStudio": False,
            "modeBarButtonsToRemove": ["sendDataToCloud", "editInChartStudio"],
            "toImageButtonOptions": {"format": fmt, "filename": safe_filename(filename),
                                     "scale": 2}}


def safe_filename(name: str) -> str:
    """`name` with anything but letters, digits, '-', '_' and '.' replaced by '_'."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "attnlens"


def graph(graph_id: str, config: dict | None = None, **kwargs) -> dcc.Graph:
    return dcc.Graph(id=graph_id, config=config or graph_config(), **kwargs)


LOADING_DELAY_MS = 400   # a spinner appears only for what takes longer than this


def loading(children, **kwargs) -> dcc.Loading:
    """A progress indicator around `children`: after LOADING_DELAY_MS of waiting a spinner
    shows over them, and the old figures stay visible (dimmed) until the new ones arrive."""
    return dcc.Loading(children, type="circle", delay_show=LOADING_DELAY_MS,
                       overlay_style={"visibility": "visible", "opacity": 0.5,
                                      "filter": "grayscale(0.5)"}, **kwargs)


def error_box(box_id: str) -> html.Div:
    return html.Div(id=box_id, style={"color": "#b00020", "marginTop": "6px",
                                      "whiteSpace": "pre-wrap"})


def note_box(box_id: str, pre_wrap: bool = True) -> html.Div:
    """A grey box for a callback's notes (kept line breaks unless `pre_wrap` is False)."""
    return html.Div(id=box_id, style={"color": "#555", "whiteSpace": "pre-wrap"} if pre_wrap
                    else {"color": "#555"})


def control_row(*items, wrap: bool = True) -> html.Div:
    """A row of controls; each str among `items` becomes a bold label (for the control after
    it). Wrapped onto more lines when too wide, unless `wrap` is False."""
    style = {"display": "flex", "gap": "8px", "alignItems": "center"}
    if wrap:
        style["flexWrap"] = "wrap"
    return html.Div([html.Label(item, style={"fontWeight": "bold"}) if isinstance(item, str)
                     else item for item in items], style=style)


def number_input(input_id: str, value: int, minimum: int = 0, width: str = "70px") -> dcc.Input:
    """A whole-number input that reports its value on Enter or leaving the box."""
    return dcc.Input(id=input_id, type="number", min=minimum, step=1, value=value, debounce=True,
                     style={"width": width})


def frame_table(df, columns: dict[str, str], class_name: str, bold: str | None = None
                ) -> html.Table:
    """The rows of DataFrame `df` as a table (the Induction page's look): `columns` maps a
    column of `df` to its header; floats with 3 decimals; column `bold` in bold."""
    cell = {"padding": "2px 10px", "textAlign": "right"}
    head = html.Tr([html.Th(title, style={**cell, "borderBottom": "1px solid #999"})
                    for title in columns.values()])
    rows = [html.Tr([html.Td(f"{r[c]:.3f}" if isinstance(r[c], float) else str(r[c]),
                             style={**cell, "fontWeight": "bold"} if c == bold else cell)
                     for c in columns]) for _, r in df.iterrows()]
    return html.Table([head, *rows], className=class_name,
                      style={"fontFamily": "monospace", "fontSize": "12px",
                             "borderCollapse": "collapse", "marginBottom": "12px"})


def check_index(name: str, value, size: int, owner: str = "") -> int:
    """`value` (an int, or a string of digits from a URL) as an index in [0, size)."""
    if isinstance(value, str) and value.strip().isascii() and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < size:
        where = f" of {owner}" if owner else ""
        raise ValueError(f"{name} {value!r} is not a valid {name}{where}: choose 0 .. {size - 1}")
    return value


def check_int(name: str, value, low: int, high: int, owner: str = "") -> int:
    """`value` (an int, or a string of digits) in [low, high]; one message for every bad
    value: "choose low .. high"."""
    if isinstance(value, str) and value.strip().isascii() and value.strip().lstrip("-").isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        where = f" of {owner}" if owner else ""
        raise ValueError(f"{name} {value!r} is not a valid {name}{where}: choose {low} .. {high}")
    return value


def check_models(store, names, minimum: int = 1, maximum: int = MAX_COMPARED) -> list[str]:
    """`names` (a list, or one name) as known model names, `minimum` .. `maximum` of them."""
    if isinstance(names, str):
        names = [names]
    if not isinstance(names, list) or not minimum <= len(names) <= maximum:
        raise ValueError(f"choose {minimum} to {maximum} models; got {names!r}")
    for name in names:
        store.get(name)  # ValueError naming the model and the available ones
    if len(set(names)) != len(names):
        raise ValueError(f"a model is chosen twice: {names}")
    return names
