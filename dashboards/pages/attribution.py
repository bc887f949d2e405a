"""Logit attribution: every head's direct contribution to the logit of one token at one
position (`attnlens.interp.tools.logit_attribution.head_logit_attribution`, drawn by
`attnlens.interp.plots.views.logit_attribution_figure`), and the heads ranked by it, each linking to
the head in the explorer. Model: the bar's "one-model pages" choice; prompt: the bar's."""

from __future__ import annotations

from dash import Input, Output, dcc, html
from dash.exceptions import PreventUpdate

from attnlens.dashboards.app_links import explorer_link
from attnlens.dashboards.figures import (
    check_index,
    control_row,
    error_box,
    graph,
    loading,
    note_box,
)
from attnlens.interp.plots.views import logit_attribution_figure
from attnlens.interp.tools.logit_attribution import head_logit_attribution

TITLE = "Logit attribution"
ID = "attribution"
TOP = 8


def layout(store):
    return html.Div([
        html.P("How much each head's output, read straight through the unembedding (final "
               "LayerNorm scale frozen), raises the logit of a token at one position: red "
               "raises, blue lowers. Paths through later layers and MLPs are left out. Empty "
               "position: the one predicting the prompt's last token; empty token: the token "
               "that follows there (the top prediction at the last position). The table "
               "ranks the heads; a head's name opens it in the explorer."),
        control_row("position", dcc.Input(id="attribution-position", type="number", step=1,
                                          value=None, debounce=True, style={"width": "80px"}),
                    "token", dcc.Input(id="attribution-target", type="text", value="",
                                       debounce=True, placeholder="top prediction",
                                       style={"width": "160px"})),
        error_box("attribution-error"),
        note_box("attribution-note"),
        loading([graph("attribution-graph"), html.Div(id="attribution-table")]),
    ])


def compute(store, name, text, position, target_text, stage="pattern"):
    """(figure, ranking table, note); ValueError for the user."""
    model = store.get(name)
    prompt = store.prompt(name, text)
    n = prompt.tokens.shape[1]
    # default: the prediction of the prompt's last token (a task example ends with its answer)
    position = max(0, n - 2) if position is None else check_index("position", position, n,
                                                                  "the prompt")
    target = int(prompt.tokens[0, position + 1]) if position + 1 < n else None
    if isinstance(target_text, str) and target_text.strip():
        target = model.to_single_token(target_text.strip())
    with store.using(name):
        table = head_logit_attribution(model, prompt.tokens, position, target)
    ranked = table.reindex(table["attribution"].abs().sort_values(ascending=False).index)
    rows = [html.Tr([html.Th(c) for c in ("head", "attribution (logits)")])]
    for _, r in ranked.head(TOP).iterrows():
        link = explorer_link(name, int(r["layer"]), int(r["head"]), stage, text)
        rows.append(html.Tr([html.Td(dcc.Link(r["head_label"], href=link)),
                             html.Td(f"{r['attribution']:+.4f}")]))
    note = (f"{name}: position {position} ({prompt.labels[position]}), target "
            f"{table['target_str'].iloc[0]!r}")
    if prompt.note:
        note += f"; {prompt.note}"
    figure = logit_attribution_figure(table, title=f"{name}: direct logit attribution to "
                                      f"{table['target_str'].iloc[0]!r} at position {position}")
    return figure, html.Table(rows, className="attribution-table",
                              style={"fontFamily": "monospace", "fontSize": "12px"}), note


def register(app, store):
    @app.callback(Output("attribution-graph", "figure"), Output("attribution-table", "children"),
                  Output("attribution-note", "children"), Output("attribution-error", "children"),
                  Input("ctl-model", "value"), Input("ctl-applied-prompt", "data"),
                  Input("attribution-position", "value"), Input("attribution-target", "value"),
                  Input("tabs", "value"))
    def _update(name, text, position, target, tab):
        if tab != ID:
            raise PreventUpdate
        try:
            figure, table, note = compute(store, name, text, position, target)
        except ValueError as err:
            return {}, [], "", str(err)
        return figure, table, note, ""
