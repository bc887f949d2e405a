"""How much a step of the attention moved a head's map: stage-to-stage change per head.

For two map stages of the catalogue (e.g. MTA's `softmax` -> `post_sm_conv`, DCMHA's `probs` ->
`pattern`, `attn_scores` -> CoPE's `attn_logits`) and every head:

- `js`: mean over query rows of the Jensen-Shannon divergence (bits, in [0, 1]) between the two
  stages' rows seen as distributions over keys (`attnlens.interp._common.to_distribution`: softmax
  for pre-softmax stages, as is for row-stochastic ones, clamped and renormalised otherwise);
- `rel_change`: ||B - A||_F / ||A||_F on the entries finite in both (the raw values);
- `top1_agreement`: share of query rows whose highest-weight key is the same.

Example:
    >>> table = stage_change(model, tokens, "softmax", "pattern")  # doctest: +SKIP
"""

from __future__ import annotations

import pandas as pd
import torch
from torch import Tensor

from attnlens.interp._common import (
    as_tokens,
    find_stage,
    head_label,
    layers_with_stage,
    run_cache,
    to_distribution,
)


def js_divergence(p: Tensor, q: Tensor) -> Tensor:
    """Jensen-Shannon divergence in bits over the last axis (rows of zeros give 0).

    Example:
        >>> js_divergence(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0]))
        tensor(1., dtype=torch.float64)
    """
    p, q = p.double(), q.double()
    m = 0.5 * (p + q)

    def kl(a: Tensor, b: Tensor) -> Tensor:
        ratio = torch.where(a > 0, a / b.clamp(min=1e-300), torch.ones_like(a))
        return (a * torch.log2(ratio)).sum(-1)

    return (0.5 * kl(p, m) + 0.5 * kl(q, m)).clamp(min=0)


def stage_change(model, tokens, source: str, target: str) -> pd.DataFrame:
    """Change from stage `source` to stage `target` of every head in the layers having both.

    Returns a DataFrame indexed by head label with `layer`, `head`, `source`, `target`, `js`,
    `rel_change`, `top1_agreement`.
    """
    tokens = as_tokens(model, tokens)
    layers = [x for x in layers_with_stage(model, source) if x in layers_with_stage(model, target)]
    if not layers:
        raise ValueError(f"no layer has both stages {source!r} and {target!r}; stages: "
                         f"{[s.name for s in model.stages(0)]}")
    names = {}
    for layer in layers:
        for name in (source, target):
            if not find_stage(model, layer, name).is_map:
                raise ValueError(f"stage {name!r} is not a [batch head query key] map")
            names[(layer, name)] = model.stage_hook_name(layer, name)
    store = run_cache(model, tokens, list(names.values()))
    T = tokens.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    rows = []
    for layer in layers:
        s_stage, t_stage = find_stage(model, layer, source), find_stage(model, layer, target)
        a, b = store[names[(layer, source)]].double(), store[names[(layer, target)]].double()
        pa, pb = to_distribution(a, s_stage), to_distribution(b, t_stage)
        js = js_divergence(pa, pb)                                  # [batch head q]
        live = (pa.sum(-1) > 0) & (pb.sum(-1) > 0)
        both = torch.isfinite(a) & torch.isfinite(b) & causal
        diff = torch.where(both, b - a, torch.zeros_like(a)).pow(2).sum((-2, -1))
        base = torch.where(both, a, torch.zeros_like(a)).pow(2).sum((-2, -1))
        rel = (diff / base.clamp(min=1e-300)).sqrt().mean(0)
        top = (pa.argmax(-1) == pb.argmax(-1)) & live
        for h in range(a.shape[1]):
            n = live[:, h].sum().clamp(min=1)
            rows.append({"head_label": head_label(layer, h), "layer": layer, "head": h,
                         "source": source, "target": target,
                         "js": float(js[:, h][live[:, h]].sum() / n),
                         "rel_change": float(rel[h]),
                         "top1_agreement": float(top[:, h].sum() / n)})
    return pd.DataFrame(rows).set_index("head_label")


def catalogue_changes(model, tokens, mode: str = "consecutive") -> pd.DataFrame:
    """`stage_change` along the catalogue of layer 0's map stages.

    `mode="consecutive"` compares each map stage with the next one (the change made by each
    step); `mode="to_pattern"` compares each with `pattern` (how far each stage is from what
    the head finally does). Side stages that are not scores or weights (CoPE's `gates` and
    `positions`) are compared like the others; read their rows accordingly.

    Returns the concatenated tables (a `head_label` column instead of the index).
    """
    if mode not in ("consecutive", "to_pattern"):
        raise ValueError(f"mode={mode!r}; choose 'consecutive' or 'to_pattern'")
    stages = [s.name for s in model.stages(0) if s.is_map]
    if mode == "consecutive":
        pairs = list(zip(stages, stages[1:], strict=False))
    else:
        pairs = [(s, "pattern") for s in stages if s != "pattern"]
    frames = []
    for src, dst in pairs:
        frames.append(stage_change(model, tokens, src, dst).reset_index())
    if not frames:
        return pd.DataFrame()
    return pd.concat(frames, ignore_index=True)
