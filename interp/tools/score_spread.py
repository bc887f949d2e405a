"""Where a head's attention gets its sharpness: the spread of its logits before and after the
steps a variant adds to q.k, and how peaked the distribution they give is.

For every head of every layer, on `tokens`, over query rows with at least `min_keys` allowed
keys (the first queries have a few keys and are sharp in every head):

- `raw_std`: the standard deviation of each row's allowed (finite) entries at `attn_scores`,
  the scaled q.k of every variant, averaged over rows;
- `logit_std`: the same at the logits that enter the softmax (`softmax_stages`: the last
  pre-softmax map stage before the first row-stochastic one: MHA and Infini `attn_scores`,
  CoPE `attn_logits`, MTA `pre_sm_mix`, DCMHA `composed_scores`);
- `entropy` (nats) and `max_weight`: of the rows of that first row-stochastic stage
  (`pattern`, `softmax`, `probs`, `local_pattern`).

`logit_std / raw_std` is how much the variant's own pre-softmax steps (CoPE's position
logits, MTA's convolution and head mixing, DCMHA's Compose) widen or narrow what q.k gives.

Example:
    >>> spread = score_spread(model, tokens)                       # doctest: +SKIP
    >>> spread.groupby("layer")[["raw_std", "logit_std"]].mean()   # doctest: +SKIP
"""

from __future__ import annotations

import pandas as pd
import torch
from torch import Tensor

from attnlens.interp._common import as_tokens, check_int, head_label, run_cache


def softmax_stages(model, layer: int) -> tuple[str, str]:
    """`(logits, distribution)`: the stage entering the softmax and the first row-stochastic
    map stage of `layer`'s catalogue."""
    stages = [s for s in model.stages(layer) if s.is_map]
    at = next((i for i, s in enumerate(stages) if s.row_stochastic), None)
    if at is None:
        raise ValueError(f"layer {layer} of this {model.cfg.attention!r} model has no "
                         f"row-stochastic map stage")
    before = [s.name for s in stages[:at] if s.softmax == "pre"]
    if not before:
        raise ValueError(f"layer {layer} has no pre-softmax map stage before "
                         f"{stages[at].name!r}")
    return before[-1], stages[at].name


def _mean_over_rows(values: Tensor, rows: Tensor) -> Tensor:
    """`[head]` mean of `values` `[batch head q]` over the kept `rows` (NaN where none is)."""
    n = rows.sum((0, 2))
    return torch.where(n > 0, (values * rows).sum((0, 2)) / n.clamp(min=1), torch.nan)


def _row_std(maps: Tensor, rows: Tensor) -> Tensor:
    """`[head]` mean over the kept rows of each row's std over its finite entries."""
    maps = maps.double()
    live = torch.isfinite(maps)
    n = live.sum(-1).clamp(min=1)
    mean = torch.where(live, maps, 0.0).sum(-1) / n
    var = torch.where(live, (maps - mean.unsqueeze(-1)) ** 2, 0.0).sum(-1) / n
    return _mean_over_rows(var.sqrt(), rows)


def score_spread(model, tokens, min_keys: int = 32) -> pd.DataFrame:
    """One row per head: `layer`, `head`, `logit_stage`, `distribution_stage`, `rows` (query
    rows measured), `raw_std`, `logit_std`, `entropy`, `max_weight` (see the module
    docstring; NaN where no row has `min_keys` keys, e.g. Infini segments shorter than that),
    indexed by head label."""
    check_int("min_keys", min_keys)
    tokens = as_tokens(model, tokens)
    if tokens.shape[1] <= min_keys:
        raise ValueError(f"{tokens.shape[1]} positions leave no query with min_keys={min_keys} "
                         f"keys")
    stages = {layer: ("attn_scores", *softmax_stages(model, layer))
              for layer in range(model.cfg.n_layers)}
    hook_names = {layer: [model.stage_hook_name(layer, s) for s in layer_stages]
                  for layer, layer_stages in stages.items()}
    store = run_cache(model, tokens, sorted({n for names in hook_names.values() for n in names}))
    rows = []
    for layer, (_, logit_name, dist_name) in stages.items():
        raw, logits, dist = (store[name] for name in hook_names[layer])
        dist = dist.double()
        keep = (torch.isfinite(logits).sum(-1) >= min_keys).double()        # [batch head q]
        plogp = torch.where(dist > 0, dist * dist.clamp(min=1e-300).log(), 0.0)
        entropy = _mean_over_rows(-plogp.sum(-1), keep)
        peak = _mean_over_rows(dist.max(-1).values, keep)
        raw_std, logit_std = _row_std(raw, keep), _row_std(logits, keep)
        kept = keep.sum((0, 2))
        for h in range(model.cfg.n_heads):
            rows.append({"head_label": head_label(layer, h), "layer": layer, "head": h,
                         "logit_stage": logit_name, "distribution_stage": dist_name,
                         "rows": int(kept[h]),
                         "raw_std": float(raw_std[h]), "logit_std": float(logit_std[h]),
                         "entropy": float(entropy[h]), "max_weight": float(peak[h])})
    return pd.DataFrame(rows).set_index("head_label")
