"""Induction-head study: previous-token, induction and duplicate-token scores of every head."""

from __future__ import annotations

import torch
from dash import Input, Output, dcc, html

from dashboards.figures import head_score_heatmaps
from interp.heads import (
    duplicate_token_scores,
    previous_token_scores,
    repeated_induction_scores,
)
from interp.tasks.induction import repeated_tokens

TITLE = "Induction heads"
ID = "heads"


def score_tables(model, batch: int = 16, half_len: int | None = None, seed: int = 0):
    """`{score name: [n_layers n_heads]}` on `[BOS] r r` repeated random tokens."""
    half = half_len or max(2, (model.cfg.n_ctx - 1) // 2)
    tokens = repeated_tokens(batch, half, model.cfg.d_vocab, seed=seed)
    names = [f"blocks.{layer}.attn.hook_pattern" for layer in range(model.cfg.n_layers)]
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=names)
    patterns = [cache[n] for n in names]
    return {
        "previous token": torch.stack([previous_token_scores(p) for p in patterns]),
        "induction": torch.stack([repeated_induction_scores(p, half) for p in patterns]),
        "duplicate token": torch.stack([duplicate_token_scores(p, tokens) for p in patterns]),
    }


def layout(store):
    return html.Div([
        html.Div([html.Label("model"),
                  dcc.Dropdown(store.names, store.names[0], id="heads-model", clearable=False,
                               style={"width": "260px"})],
                 style={"display": "flex", "gap": "10px", "alignItems": "center"}),
        html.P("Mean attention mass on the previous token, on the induction stripe of "
               "repeated random tokens, and on earlier copies of the current token."),
        dcc.Loading(dcc.Graph(id="heads-graph")),
    ])


def register(app, store):
    @app.callback(Output("heads-graph", "figure"), Input("heads-model", "value"))
    def _update(name):
        return head_score_heatmaps(score_tables(store.get(name)))
