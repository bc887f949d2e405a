"""Tokens: the views researchers know from CircuitsVis and bertviz, for every variant and stage.

The token view writes the prompt as text; hovering or clicking a token (dashboards/assets/
tokens.js) chooses it, and every token is coloured by how much the chosen one attends to it, or,
reversed, by how much it attends to the chosen one, for the bar's head or the mean of the
layer's heads. The head view (bertviz) draws lines from the chosen token to what it attends to,
one colour per head of the layer. Model: the bar's "one-model pages" choice; layer, head, stage
and prompt: the bar. The maps come from the explorer's cache (`attnlens.dashboards.map_cache`), the
colours and figures from `attnlens.interp.plots.views`.
"""

from __future__ import annotations

from dash import Input, Output, dcc, html
from dash.exceptions import PreventUpdate

from attnlens.dashboards.figures import (
    check_index,
    control_row,
    error_box,
    graph,
    loading,
    note_box,
)
from attnlens.dashboards.map_cache import MAP_CACHE
from attnlens.dashboards.panels import choose_view
from attnlens.hooked_models.tokenizers.vocab import CharTokenizer
from attnlens.interp.plots.views import head_view_figure, shown_text, token_view

TITLE = "Tokens"
ID = "tokens"
MODES = {"head": "the bar's head", "mean": "mean of the layer's heads"}
DIRECTIONS = {"from": "what the chosen token attends to", "to": "who attends to the chosen token"}
LINK = {"mode": ("tokens-mode", "head"), "direction": ("tokens-direction", "from")}
INPUTS = [Input("ctl-model", "value"), Input("ctl-applied-prompt", "data"),
          Input("ctl-layer", "value"), Input("ctl-head", "value"), Input("ctl-stage", "value"),
          Input("tokens-token", "value")]


def layout(store):
    return html.Div([
        html.P("The prompt as text. Hover over a token (or click it, or type its position) to "
               "colour the others by its attention at the bar's layer and stage: what it attends "
               "to, or who attends to it. Below, the head view: lines from the chosen token to "
               "the keys it attends to, one colour per head (the bar's head thicker). Grey: "
               "masked (a later token). Model: the bar's \"one-model pages\" choice."),
        control_row("colour by", dcc.RadioItems(
                        [{"label": v, "value": k} for k, v in MODES.items()],
                        LINK["mode"][1], id="tokens-mode", inline=True),
                    dcc.RadioItems([{"label": v, "value": k} for k, v in DIRECTIONS.items()],
                                   LINK["direction"][1], id="tokens-direction", inline=True),
                    "token", dcc.Input(id="tokens-token", type="number", min=0, step=1,
                                       value=None, debounce=True, style={"width": "80px"})),
        error_box("tokens-error"),
        note_box("tokens-note"),
        loading(html.Div(id="tokens-text", style={"lineHeight": "1.9", "marginTop": "8px",
                                                  "maxHeight": "340px", "overflowY": "auto",
                                                  "border": "1px solid #eee",
                                                  "padding": "4px"})),
        html.H4("Head view"),
        loading(graph("tokens-lines")),
    ])


def _request(store, name, text, layer, head, stage, token):
    """(model, prompt, stage, layer, head, token, maps [head q k], note) of a request: a layer,
    head or stage the model lacks is replaced by the closest and the note says so
    (`choose_view`); ValueError for the user."""
    model = store.get(name)
    choice = choose_view(store, name, layer, head, stage)
    layer, head, chosen = choice.layer, choice.head, choice.stage
    prompt = store.prompt(name, text)
    n = prompt.tokens.shape[1]
    token = n - 1 if token is None else check_index("token", token, n, "the prompt")
    _, maps = MAP_CACHE.maps(store, name, prompt.tokens, [(layer, chosen.name)])
    return model, prompt, chosen, layer, head, token, maps[(layer, chosen.name)], choice.note


def _signed(stage) -> bool | None:
    """True for a signed stage (logits, mixed maps): the zero-centred scale; else decided by
    the values."""
    return True if (not stage.row_stochastic and stage.softmax in ("pre", "post")) else None


def _strings(model, prompt) -> list[str]:
    return list(model.to_str_tokens(prompt.tokens[0]))


def text_view(store, name, text, layer, head, stage, token, mode, direction) -> tuple[list, str]:
    """The token spans and a note."""
    if not isinstance(mode, str) or mode not in MODES:
        raise ValueError(f"colour mode {mode!r} is not one of {list(MODES)}")
    if not isinstance(direction, str) or direction not in DIRECTIONS:
        raise ValueError(f"direction {direction!r} is not one of {list(DIRECTIONS)}")
    model, prompt, chosen, layer, head, token, maps, replaced = _request(
        store, name, text, layer, head, stage, token)
    view = token_view(_strings(model, prompt), maps, token, direction,
                      head if mode == "head" else None, signed=_signed(chosen))
    gap = "1px" if isinstance(model.tokenizer, CharTokenizer) else "4px"
    spans = [html.Span(shown_text(t["text"]), className="attn-tok", **{"data-index": i},
                       title=f"{i}: " + ("masked" if t["value"] is None
                                         else f"{t['value']:.4f}"),
                       style={"background": t["colour"], "color": t["ink"],
                              "border": "2px solid #d62728" if t["selected"]
                              else "1px solid #ddd", "padding": "1px 2px", "margin": f"1px {gap}",
                              "fontFamily": "monospace", "display": "inline-block",
                              "cursor": "pointer", "whiteSpace": "pre"})
             for i, t in enumerate(view)]
    # a token that ends a line ends the line here too: source code keeps its layout
    spans = [part for span, t in zip(spans, view, strict=True)
             for part in [span] + [html.Br()] * t["text"].count("\n")]
    who = f"L{layer}H{head}" if mode == "head" else f"L{layer} (mean of heads)"
    what = "attends to" if direction == "from" else "is attended by"
    note = (f"{name}: token {token} ({shown_text(view[token]['text'])}) {what}, {who}, "
            f"hook_{chosen.name}")
    for extra in (prompt.note, replaced):
        if extra:
            note += f"; {extra}"
    return spans, note


def lines_view(store, name, text, layer, head, stage, token) -> dict:
    model, prompt, chosen, layer, head, token, maps, _ = _request(store, name, text, layer, head,
                                                                  stage, token)
    fig = head_view_figure(_strings(model, prompt), maps, token, chosen=head, title=(
        f"{name} L{layer} hook_{chosen.name}: token {token} attends to (every head; "
        f"H{head} thicker)"))
    return fig


def register(app, store):
    @app.callback(Output("tokens-text", "children"), Output("tokens-note", "children"),
                  Output("tokens-error", "children"), *INPUTS,
                  Input("tokens-mode", "value"), Input("tokens-direction", "value"),
                  Input("tabs", "value"))
    def _text(name, text, layer, head, stage, token, mode, direction, tab):
        if tab != ID:
            raise PreventUpdate
        try:
            spans, note = text_view(store, name, text, layer, head, stage, token, mode,
                                    direction)
        except ValueError as err:
            return [], "", str(err)
        return spans, note, ""

    @app.callback(Output("tokens-lines", "figure"), *INPUTS, Input("tabs", "value"))
    def _lines(name, text, layer, head, stage, token, tab):
        if tab != ID:
            raise PreventUpdate
        try:
            return lines_view(store, name, text, layer, head, stage, token)
        except ValueError:
            return {}
