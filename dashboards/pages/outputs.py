"""Outputs: what the chosen models predict on the prompt. Next-token loss by position (one line
per model), each model's top-k predictions per position as token strings, and the prompt read
twice: how much lower the loss is on the second copy (copying from context, induction)."""

from __future__ import annotations

from dash import Input, Output, dcc, html
from dash.exceptions import PreventUpdate

from attnlens.dashboards.figures import (
    check_index,
    check_int,
    check_models,
    control_row,
    error_box,
    graph,
    graph_config,
    loading,
    note_box,
    number_input,
)
from attnlens.interp.plots.outputs import position_loss_figure, repeat_loss_figure, top_k_figure
from attnlens.interp.tools.outputs import MAX_K, next_token_losses, repeat_losses, top_predictions

TITLE = "Outputs"
ID = "outputs"
ROWS = 64           # positions shown per top-k table (from the chosen start position)
# the page's own controls in the deep link (`attnlens.dashboards.app`): URL key -> (component,
# default)
LINK = {"k": ("outputs-k", 5), "start": ("outputs-start", 0)}


def layout(store):
    return html.Div([
        html.P("Loss: how surprised each model is by each token of the prompt (nats; lower is "
               "better). Top predictions: the k tokens each model finds most likely to come "
               "next, coloured by probability, with a tick on the true next token. Read twice: "
               "the prompt is repeated; a model that copies from context predicts the second "
               "copy far better, so the gap between the dotted and solid lines is its "
               "in-context copying."),
        control_row("top k", dcc.Dropdown(list(range(1, MAX_K + 1)), LINK["k"][1],
                                          id="outputs-k", clearable=False,
                                          style={"width": "80px"}),
                    "table from position",
                    number_input("outputs-start", LINK["start"][1], width="90px"), wrap=False),
        error_box("outputs-error"),
        note_box("outputs-note"),
        loading([graph("outputs-loss"), graph("outputs-repeat"),
                     html.Div(id="outputs-topk")]),
    ])


def compute(store, names, text, k, start) -> dict:
    """The page's figures for one request (ValueError for a request nothing can answer; a model
    that cannot read the prompt is named in `notes` and left out)."""
    names = check_models(store, names)
    k = check_int("k", k, 1, MAX_K)
    if start is None:
        start = 0
    curves, repeats, tables, notes = {}, {}, [], []
    for name in names:
        try:
            prompt = store.prompt(name, text)
            first = check_index("table start position", start, prompt.tokens.shape[1], name)
            with store.using(name) as model:
                losses = next_token_losses(model, prompt.tokens).mean(0)
                repeat = repeat_losses(model, prompt.tokens)
                top = top_predictions(model, prompt.tokens[:1], k=min(k, model.cfg.d_vocab))
        except ValueError as err:
            notes.append(f"{name}: {err}")
            continue
        if prompt.note:
            notes.append(f"{name}: {prompt.note}")
        if repeat.n_tokens < repeat.cut_from:
            notes.append(f"{name}: read twice, the prompt is cut to its first {repeat.n_tokens} "
                         f"of {repeat.cut_from} tokens so that both copies fit the context")
        curves[name], repeats[name] = (losses, prompt.labels), repeat
        shown = top[(top["position"] >= first) & (top["position"] < first + ROWS)]
        tables.append(graph(f"outputs-topk-{len(tables)}", figure=top_k_figure(
            shown, title=f"{name}: top {k} predictions, positions {first} .. "
                         f"{int(shown['position'].max())}"),
            config=graph_config(f"{name}_top{k}")))
    if not curves:
        raise ValueError("\n".join(notes))
    return {"loss": position_loss_figure(curves), "repeat": repeat_loss_figure(repeats),
            "tables": tables, "note": "\n".join(notes)}


def register(app, store):
    @app.callback(Output("outputs-loss", "figure"), Output("outputs-repeat", "figure"),
                  Output("outputs-topk", "children"), Output("outputs-error", "children"),
                  Output("outputs-note", "children"),
                  Input("tabs", "value"), Input("ctl-models", "value"),
                  Input("ctl-applied-prompt", "data"), Input("outputs-k", "value"),
                  Input("outputs-start", "value"))
    def _update(tab, names, text, k, start):
        if tab != ID:   # nothing computed for a hidden tab (nor at page load)
            raise PreventUpdate
        try:
            out = compute(store, names, text, k, start)
        except ValueError as err:
            return {}, {}, [], str(err), ""
        return out["loss"], out["repeat"], out["tables"], "", out["note"]
