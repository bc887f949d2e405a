"""The views researchers know from CircuitsVis and bertviz, for every variant and stage, and the
per-head tables that link into them.

- `token_view`: the prompt as text, each token coloured by how much a chosen token attends to
  it (or, reversed, how much it attends to the chosen token), for one head or the mean of the
  heads (CircuitsVis' `colored_tokens` / attention view). Returns plain data (text, colours),
  which the dashboard lays out as HTML and a notebook can print as HTML (`token_view_html`).
- `head_view_figure`: bertviz's head view: the tokens in two columns, lines from the chosen
  token to what it attends to, one colour per head, opacity by weight.
- `logit_attribution_figure`: per-head direct logit attribution
  (`attnlens.interp.tools.logit_attribution`).

Example:
    >>> maps = compute_maps(model, tokens, [(1, "pattern")])[(1, "pattern")]   # doctest: +SKIP
    >>> head_view_figure(model.to_str_tokens(tokens[0]), maps, query=20)       # doctest: +SKIP
"""

from __future__ import annotations

import html as _html

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch

from attnlens.interp.plots.colors import MASKED, colour, scale_args, value_colour

MAX_ROWS = 64        # the head view lists every token up to this many, else the relevant ones
TOP_LINES = 8        # lines per head in the head view: its largest weights


def _values(maps: torch.Tensor, token: int, direction: str, head: int | None) -> np.ndarray:
    """`[pos]` weights of the chosen token: its row ("from": what it attends to) or its column
    ("to": who attends to it), of head `head` or the mean over heads (None)."""
    if direction not in ("from", "to"):
        raise ValueError(f"direction {direction!r} is not 'from' or 'to'")
    m = maps.detach().double()
    m = torch.where(torch.isfinite(m), m, torch.nan)
    m = m[head] if head is not None else torch.nanmean(m, 0)
    return (m[token] if direction == "from" else m[:, token]).numpy()


def token_view(tokens: list[str], maps: torch.Tensor, token: int, direction: str = "from",
               head: int | None = None, signed: bool | None = None) -> list[dict]:
    """One dict per token: `text`, `value`, `colour` (background), `ink` (text colour) and
    `selected`. `maps` is `[head q k]` (one layer and stage); `token` the chosen position;
    `direction` "from" colours what it attends to, "to" who attends to it; `head` None: the
    mean over heads. Masked positions (the future, for "from") are grey. `signed` (default:
    any value < 0) picks the zero-centred scale of signed stages."""
    n = len(tokens)
    if maps.ndim != 3 or maps.shape[1:] != (n, n):
        raise ValueError(f"maps must be [head {n} {n}] for {n} tokens, got {tuple(maps.shape)}")
    if not 0 <= token < n:
        raise ValueError(f"token {token} is outside the prompt: choose 0 .. {n - 1}")
    if head is not None and not 0 <= head < maps.shape[0]:
        raise ValueError(f"head {head} is not one of 0 .. {maps.shape[0] - 1}")
    values = _values(maps, token, direction, head)
    # the causal mask: keys after the chosen query ("from"), queries before the chosen key
    # ("to") are masked, not zero, where they hold exactly 0
    later = np.arange(n) > token if direction == "from" else np.arange(n) < token
    values[later & (values == 0)] = np.nan
    finite = values[np.isfinite(values)]
    if signed is None:
        signed = bool((finite < 0).any())
    top = float(np.abs(finite).max()) if finite.size else 1.0
    out = []
    for i, (text, v) in enumerate(zip(tokens, values, strict=True)):
        bg = value_colour(v, top, signed)
        strong = np.isfinite(v) and abs(v) / (top or 1.0) > 0.6
        out.append({"text": text, "value": None if not np.isfinite(v) else float(v),
                    "colour": bg, "ink": "#ffffff" if strong else "#111111",
                    "selected": i == token})
    return out


def shown_text(text: str) -> str:
    """A token's text as it is shown: spaces and line breaks made visible."""
    return text.replace(" ", "\u2423").replace("\n", "\u21b5") or "\u2205"


def token_view_html(view: list[dict]) -> str:
    """`token_view` as an HTML string (a notebook: `IPython.display.HTML(...)`)."""
    spans = []
    for i, t in enumerate(view):
        border = "2px solid #d62728" if t["selected"] else "1px solid #ddd"
        value = "masked" if t["value"] is None else f"{t['value']:.4f}"
        spans.append(f"<span title='{i}: {value}' style='background:{t['colour']};"
                     f"color:{t['ink']};border:{border};padding:1px 2px;margin:1px;"
                     f"font-family:monospace;display:inline-block'>"
                     f"{_html.escape(shown_text(t['text']))}</span>")
    return "<div style='line-height:1.9'>" + "".join(spans) + "</div>"


def _rows(n: int, query: int, keys: set[int]) -> list[int | None]:
    """The positions the head view lists (None: a gap): every one up to MAX_ROWS, else the
    query, its 8 predecessors and the keys that get a line."""
    if n <= MAX_ROWS:
        return list(range(n))
    wanted = sorted({query, *range(max(0, query - 8), query), *keys})
    rows: list[int | None] = []
    for p in wanted:
        if rows and rows[-1] is not None and p != rows[-1] + 1:
            rows.append(None)
        rows.append(p)
    return rows


def head_view_figure(tokens: list[str], maps: torch.Tensor, query: int,
                     heads: list[int] | None = None, chosen: int | None = None,
                     top: int = TOP_LINES, title: str = "") -> go.Figure:
    """bertviz's head view: tokens listed twice (left: the query side, right: the keys), a line
    from `query` to each key it attends to, one colour per head, opacity and width by
    |weight| / the largest; dashed for negative weights (signed stages). `heads` default all;
    `chosen` is drawn on top and thicker. Only each head's `top` largest weights get a line.
    Long prompts list the query, its neighbours and the keys that get a line (gaps marked)."""
    n = len(tokens)
    if maps.ndim != 3 or maps.shape[1:] != (n, n):
        raise ValueError(f"maps must be [head {n} {n}] for {n} tokens, got {tuple(maps.shape)}")
    if not 0 <= query < n:
        raise ValueError(f"query {query} is outside the prompt: choose 0 .. {n - 1}")
    heads = list(range(maps.shape[0])) if heads is None else list(heads)
    m = maps.detach().double()
    m = torch.where(torch.isfinite(m), m, torch.zeros((), dtype=m.dtype))
    lines = {}
    for h in heads:
        row = m[h, query]
        k = min(top, n)
        idx = row.abs().topk(k).indices.tolist()
        lines[h] = [(j, float(row[j])) for j in idx if row[j] != 0]
    biggest = max((abs(w) for ls in lines.values() for _, w in ls), default=1.0) or 1.0
    rows = _rows(n, query, {j for ls in lines.values() for j, _ in ls})
    y_of = {p: i for i, p in enumerate(rows) if p is not None}
    fig = go.Figure()
    order = [h for h in heads if h != chosen] + ([chosen] if chosen in heads else [])
    for h in order:
        for j, w in lines[h]:
            a = abs(w) / biggest
            fig.add_trace(go.Scatter(
                x=[0, 1], y=[y_of[query], y_of[j]], mode="lines", showlegend=False,
                line=dict(color=colour(h), width=(4 if h == chosen else 2) * max(a, 0.15),
                          dash="dash" if w < 0 else "solid"),
                opacity=max(0.15, a), hoverinfo="text", legendgroup=f"H{h}",
                text=f"H{h}: {tokens[query]!r} -> {tokens[j]!r} {w:.4f}"))
    for h in heads:          # the legend: one entry per head
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="lines", name=f"H{h}",
                                 line=dict(color=colour(h), width=4 if h == chosen else 2),
                                 legendgroup=f"H{h}"))
    labels = ["\u22ee" if p is None else f"{p}: {shown_text(tokens[p])}" for p in rows]
    for x, anchor in ((0, "left"), (1, "right")):   # labels outside the lines' span
        fig.add_trace(go.Scatter(
            x=[x] * len(rows), y=list(range(len(rows))), mode="text", text=labels,
            textposition=f"middle {anchor}", showlegend=False, hoverinfo="skip",
            textfont=dict(size=11, family="monospace",
                          color=["#d62728" if (p == query and x == 0) else "#111"
                                 for p in rows])))
    fig.update_xaxes(visible=False, range=[-0.9, 1.9])
    fig.update_yaxes(visible=False, autorange="reversed")
    fig.update_layout(title=dict(text=title or f"head view: token {query} attends to",
                                 font=dict(size=13)),
                      height=120 + 16 * len(rows), plot_bgcolor="#ffffff",
                      margin=dict(l=10, r=10, t=60, b=10),
                      legend=dict(orientation="h", y=1.0, yanchor="bottom", x=0))
    return fig


def logit_attribution_figure(table: pd.DataFrame, title: str = "") -> go.Figure:
    """Layer x head heatmap of `attnlens.interp.tools.logit_attribution.head_logit_attribution`: red
    raises the target's logit, blue lowers it (zero-centred), the value written in each cell."""
    grid = table.pivot_table(index="layer", columns="head", values="attribution")
    z = grid.to_numpy()
    fig = go.Figure(go.Heatmap(
        z=z, x=[f"H{h}" for h in grid.columns], y=[f"L{la}" for la in grid.index],
        **scale_args(z, signed=True), texttemplate="%{z:.2f}", textfont=dict(size=11),
        colorbar=dict(title=dict(text="logit", side="right"), thickness=14),
        hovertemplate="%{y}%{x}: %{z:.4f} logits<extra></extra>"))
    target = table["target_str"].iloc[0] if len(table) else ""
    position = int(table["position"].iloc[0]) if len(table) else 0
    fig.update_yaxes(autorange="reversed", title="layer")
    fig.update_xaxes(title="head")
    fig.update_layout(title=dict(text=title or f"direct logit attribution to {target!r} at "
                                 f"position {position}", font=dict(size=13)),
                      height=160 + 44 * len(grid), plot_bgcolor=MASKED,
                      margin=dict(l=60, r=20, t=60, b=50))
    return fig


__all__ = ["head_view_figure", "logit_attribution_figure", "shown_text", "token_view",
           "token_view_html"]
