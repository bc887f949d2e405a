"""Attribution measures of one prompt at a time, for studies over many prompts (the sweep's
`attribution` analysis, `attnlens.interp.sweep.analyses`).

For each prompt: its attribution graph (`graph.attribute`, the likeliest next token as the
target logit) and the head loadings of the edges into that logit
(`head_loadings.head_loadings`). Rows `(measure, layer, head, value)`, one set per prompt,
averaged over the prompts given (so a sweep's prompt-weighted mean over shards is the mean over
all prompts):

- `error_share`, `embedding_share`, `feature_share` (layer -1, head -1): the shares of the
  |direct effects| into the target logit from error nodes, embeddings and features;
- `n_features`: active transcoder features; `target_prob`: the target token's probability;
- `head_loading` (each layer, head): the |edge weight| into the target logit carried by that
  head (for MTA and DCMHA: source head), over the |edge weight| in all;
- `bypass_share` (each layer, head -1): the share that bypasses the layer's attention.

Example:
    >>> attribution_measures(model, transcoders, tokens)                 # doctest: +SKIP
"""

from __future__ import annotations

import pandas as pd
import torch
from torch import Tensor

from attnlens.interp.attribution.graph import attribute
from attnlens.interp.attribution.head_loadings import head_loadings


def prompt_measures(model, transcoders, tokens: Tensor, batch_size: int = 64) -> list[dict]:
    """The rows (module doc) of one prompt `[1 pos]`."""
    with torch.enable_grad():
        graph = attribute(model, transcoders, tokens, max_logits=1, batch_size=batch_size)
        target = graph.logit_index(0)
        mask = torch.zeros_like(graph.adjacency, dtype=torch.bool)
        mask[target] = True
        loads = head_loadings(model, transcoders, graph, edge_mask=mask, batch_size=batch_size)
    row = graph.adjacency[target].abs()
    total = float(row.sum()) or 1.0
    n_f, n_e = graph.n_features, graph.n_errors
    rows = [("error_share", float(row[n_f:n_f + n_e].sum()) / total),
            ("embedding_share", float(row[n_f + n_e:n_f + n_e + graph.n_pos].sum()) / total),
            ("feature_share", float(row[:n_f].sum()) / total),
            ("n_features", float(n_f)), ("target_prob", float(graph.logit_probabilities[0]))]
    out = [dict(measure=m, layer=-1, head=-1, value=v) for m, v in rows]
    heads = loads.heads.abs().sum(0) / total                  # [n_layers n_heads]
    bypass = loads.bypass.abs().sum(0) / total
    for layer in range(heads.shape[0]):
        out += [dict(measure="head_loading", layer=layer, head=h, value=float(heads[layer, h]))
                for h in range(heads.shape[1])]
        out.append(dict(measure="bypass_share", layer=layer, head=-1,
                        value=float(bypass[layer])))
    return out


def attribution_measures(model, transcoders, tokens: Tensor, batch_size: int = 64
                         ) -> pd.DataFrame:
    """The rows (module doc) averaged over the prompts `tokens` `[batch pos]`."""
    if not isinstance(tokens, Tensor) or tokens.ndim != 2 or tokens.shape[0] == 0:
        raise ValueError("tokens must be a [batch, pos] tensor with at least one prompt")
    rows = [r for i in range(tokens.shape[0])
            for r in prompt_measures(model, transcoders, tokens[i:i + 1], batch_size)]
    table = pd.DataFrame(rows).groupby(["measure", "layer", "head"], sort=False,
                                       as_index=False)["value"].mean()
    return table.astype({"layer": "int64", "head": "int64", "value": "float64"})


__all__ = ["attribution_measures", "prompt_measures"]
