"""CoPE views: which tokens open a head's gates, what it counts, its positional-only attention.

Works on any model whose catalogue has the contextual-position stages `gates` (g_ij in [0, 1]),
`positions` (p_ij = sum of gates from key j to query i) and `pos_logits` (q_i.e[p_ij]); layers
without them (CoPE on every k-th layer) are skipped, models without them raise ValueError.

- `gate_openers`: per head and key token, the mean gate over the queries that can see it: a
  head whose gates open only on "." or newline counts sentences or lines (paper Fig. 1).
- `counted_units`: per head, the share of keys it counts (g > threshold), how far apart its
  counted units are, and its mean position at the last query (how many units it sees).
- `positional_attention`: softmax_j(q_i.e[p_ij]) over the allowed keys, the attention a head
  would pay on position alone (paper Fig. 4).
- `gates_by_category`: per head, the mean gate by the key token's coarse category in Python
  source (`token_category`: newline, indentation, identifier, ...): a head whose gates open on
  newlines counts lines.

Example:
    >>> gate_openers(model, tokens).head()                     # doctest: +SKIP
"""

from __future__ import annotations

import pandas as pd
import torch
from torch import Tensor

from attnlens.interp._common import (
    as_tokens,
    check_fraction,
    check_int,
    check_layer,
    has_stage,
    head_label,
    run_cache,
)

NEEDED = ("gates", "positions", "pos_logits")
TOKEN_CATEGORIES = ("newline", "indentation", "identifier", "keyword-like", "number",
                    "punctuation", "string/other")
_KEYWORDS = frozenset(__import__("keyword").kwlist) | {"self", "cls"}


def cope_layers(model) -> list[int]:
    """Layers whose catalogue has `gates`, `positions` and `pos_logits`."""
    return [layer for layer in range(model.cfg.n_layers)
            if all(has_stage(model, layer, n) for n in NEEDED)]


def _require(model) -> list[int]:
    layers = cope_layers(model)
    if not layers:
        raise ValueError(f"this {model.cfg.attention!r} model has no layer with the stages "
                         f"{list(NEEDED)} (contextual position encoding)")
    return layers


def _maps(model, tokens: Tensor, layers: list[int], stages) -> dict:
    names = [f"blocks.{layer}.attn.hook_{s}" for layer in layers for s in stages]
    return run_cache(model, tokens, names)


def _token_name(model, tok: int) -> str:
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is not None:
        try:
            return model.to_string(torch.tensor([tok]))
        except Exception:  # noqa: BLE001 - labels are cosmetic
            pass
    return str(tok)


def gate_openers(model, tokens, top: int | None = 10) -> pd.DataFrame:
    """Mean gate of each (layer, head, key token) over the queries that see the key.

    Returns a DataFrame with `head_label`, `layer`, `head`, `token` (id), `token_str`,
    `mean_gate`, `count` (number of (query, key) pairs), sorted by head then descending gate;
    `top` keeps that many tokens per head (None: all).
    """
    if top is not None:
        check_int("top", top)
    tokens = as_tokens(model, tokens)
    layers = _require(model)
    store = _maps(model, tokens, layers, ["gates"])
    T = tokens.shape[1]
    seen = torch.ones(T, T, dtype=torch.bool).tril()                  # query >= key
    rows = []
    for layer in layers:
        g = store[f"blocks.{layer}.attn.hook_gates"].double()          # [b h q k]
        per_key = (g * seen).sum(-2) / seen.sum(0)                     # [b h k] mean over q
        for h in range(g.shape[1]):
            frame = pd.DataFrame({"token": tokens.flatten().cpu().numpy(),
                                  "gate": per_key[:, h].flatten().cpu().numpy()})
            stats = frame.groupby("token")["gate"].agg(["mean", "count"]).reset_index()
            stats = stats.sort_values("mean", ascending=False)
            if top is not None:
                stats = stats.head(top)
            for _, r in stats.iterrows():
                tok = int(r["token"])
                rows.append({"head_label": head_label(layer, h), "layer": layer, "head": h,
                             "token": tok, "token_str": _token_name(model, tok),
                             "mean_gate": float(r["mean"]),
                             "count": int(r["count"])})
    return pd.DataFrame(rows, columns=["head_label", "layer", "head", "token", "token_str",
                                       "mean_gate", "count"])


def counted_units(model, tokens, threshold: float = 0.5) -> pd.DataFrame:
    """Per head: what it counts.

    Returns a DataFrame indexed by head label with `layer`, `head`, `mean_gate`,
    `counted_share` (share of visible (query, key) pairs with gate > threshold),
    `last_position` (mean p at the last query for key 0: the number of units counted over the
    whole input; equals the length for relative positions) and `relative_likeness`
    (`last_position / length`: 1 when every token counts, as relative PE).
    """
    check_fraction("threshold", threshold)
    tokens = as_tokens(model, tokens)
    layers = _require(model)
    store = _maps(model, tokens, layers, ["gates", "positions"])
    T = tokens.shape[1]
    seen = torch.ones(T, T, dtype=torch.bool).tril()
    rows = []
    for layer in layers:
        g = store[f"blocks.{layer}.attn.hook_gates"].double()
        p = store[f"blocks.{layer}.attn.hook_positions"].double()
        for h in range(g.shape[1]):
            vis = g[:, h][:, seen]
            last = float(p[:, h, -1, 0].mean())
            rows.append({"head_label": head_label(layer, h), "layer": layer, "head": h,
                         "mean_gate": float(vis.mean()),
                         "counted_share": float((vis > threshold).double().mean()),
                         "last_position": last, "relative_likeness": last / T})
    return pd.DataFrame(rows).set_index("head_label")


def positional_attention(model, tokens, layer: int) -> Tensor:
    """`[batch head_index query_pos key_pos]` softmax of q_i.e[p_ij] over the allowed keys.

    Allowed keys are those where the layer's `attn_scores` are finite (causal and padding mask).
    """
    tokens = as_tokens(model, tokens)
    layer = check_layer(model, layer)
    if layer not in _require(model):
        raise ValueError(f"layer {layer} has no contextual positions; CoPE layers: "
                         f"{cope_layers(model)}")
    store = _maps(model, tokens, [layer], ["pos_logits", "attn_scores"])
    logits = store[f"blocks.{layer}.attn.hook_pos_logits"]
    allowed = torch.isfinite(store[f"blocks.{layer}.attn.hook_attn_scores"])
    out = torch.softmax(logits.double().masked_fill(~allowed, float("-inf")), dim=-1)
    out = torch.where(allowed.any(-1, keepdim=True), out, torch.zeros_like(out))
    return out.to(logits.dtype)


def token_category(text: str) -> str:
    """A coarse class of a token's text in Python source, one of `TOKEN_CATEGORIES`.

    Example:
        >>> token_category("\\n    "), token_category(" def"), token_category(" foo")
        ('newline', 'keyword-like', 'identifier')
    """
    if "\n" in text:
        return "newline"
    if text and text.strip() == "":
        return "indentation"
    core = text.strip()
    if core.isidentifier():
        return "keyword-like" if core in _KEYWORDS else "identifier"
    if core.replace("_", "").replace(".", "").isdigit():
        return "number"
    if core and all(not ch.isalnum() for ch in core):
        return "punctuation"
    return "string/other"


def gates_by_category(model, tokens) -> pd.DataFrame:
    """Mean CoPE gate per head and `token_category` of the key: what each head counts.

    Returns `head_label`, `layer`, `head`, `category` (in `TOKEN_CATEGORIES` order), `count`
    (key positions of that category) and `mean_gate` (each key's gate averaged over the
    queries that see it, then over the category's keys). The BOS key is left out: a sink
    every query sees, not a unit of text. Needs the model's tokenizer (to read each key's
    text).
    """
    tokenizer = getattr(model, "tokenizer", None)
    if tokenizer is None:
        raise ValueError("gates_by_category reads each key's text: this model has no "
                         "tokenizer (model.tokenizer is None)")
    table = gate_openers(model, tokens, top=None)
    bos = tokenizer.bos_token_id
    if bos is not None:
        table = table[table["token"] != bos].reset_index(drop=True)
    strings = {t: tokenizer.decode([t]) for t in table["token"].unique()}
    table["category"] = table["token"].map(lambda t: token_category(strings[t]))
    table["weighted"] = table["mean_gate"] * table["count"]
    grouped = table.groupby(["head_label", "layer", "head", "category"], as_index=False)[
        ["weighted", "count"]].sum()
    grouped["mean_gate"] = grouped["weighted"] / grouped["count"]
    order = {c: i for i, c in enumerate(TOKEN_CATEGORIES)}
    grouped = grouped.sort_values(["layer", "head", "category"],
                                  key=lambda col: col.map(order) if col.name == "category"
                                  else col, ignore_index=True)
    return grouped.drop(columns="weighted")
