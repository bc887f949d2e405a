"""Helpers for using other toolkits' code on every variant (docs/ecosystem.md).

`hook_pattern` is the effective pattern (docs/design.md contract 4): for MTA and DCMHA its rows are
signed and need not sum to 1, for Infini-attention it spans the memory too. Tools written for
softmax patterns then mislead: TransformerLens's `detect_head` divides by the row mass and gives
scores above 1 or below 0, and CircuitsVis colours a [0, 1] range. These helpers pick a
row-stochastic stage instead, or give the colour range a signed stage needs.

Example:
    >>> row_stochastic_stage(model, 0)              # doctest: +SKIP
    'softmax'                                       # an MTA layer
    >>> cache = stage_cache(model, "abcabc", remove_batch_dim=True)   # doctest: +SKIP
    >>> detect_head(model, "abcabc", "previous_token_head", cache=cache)   # doctest: +SKIP
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformer_lens import ActivationCache


def row_stochastic_stage(model, layer: int) -> str:
    """The map stage of `layer` whose rows are distributions and that is closest to the values:
    "pattern" when it is one (MHA, CoPE), else the last row-stochastic stage before it
    (MTA's "softmax", DCMHA's "probs", Infini's "local_pattern")."""
    stages = [s for s in model.stages(layer) if s.is_map]
    if not stages:
        raise ValueError(f"layer {layer} has no map stages")
    chosen = [s.name for s in stages if s.row_stochastic]
    if not chosen:
        raise ValueError(f"layer {layer} ({model.cfg.attention}) has no row-stochastic stage; "
                         f"stages: {[s.name for s in stages]}")
    return "pattern" if "pattern" in chosen else chosen[-1]


def stage_cache(model, input, stage: str = "auto",
                remove_batch_dim: bool = False) -> ActivationCache:
    """An `ActivationCache` of `input` whose `hook_pattern` entries hold `stage` ("auto": each
    layer's `row_stochastic_stage`), for TransformerLens tools that read `cache["pattern", l]`:
    `detect_head(model, seq, name, cache=stage_cache(model, seq, remove_batch_dim=True))`
    (detect_head reads one sequence without its batch axis)."""
    names = {}
    for layer in range(model.cfg.n_layers):
        name = row_stochastic_stage(model, layer) if stage == "auto" else stage
        names[f"blocks.{layer}.attn.hook_pattern"] = model.stage_hook_name(layer, name)
    _, cache = model.run_with_cache(input, names_filter=list(set(names.values())),
                                    return_cache_object=False, remove_batch_dim=remove_batch_dim)
    swapped = {pattern: cache[source] for pattern, source in names.items()}
    return ActivationCache(swapped, model, has_batch_dim=not remove_batch_dim)


def circuitsvis_args(model, input, layer: int, stage: str = "pattern",
                     batch_index: int = 0) -> dict:
    """Keyword arguments for `circuitsvis.attention.attention_heads` (or `attention_patterns`)
    showing `stage` of `layer`: `attention` `[head query key]`, `tokens`, and `min_value` /
    `max_value`: [0, 1] for a row-stochastic stage, else zero-centred (`-m, m`, m the largest
    absolute entry), so negative weights get their own colour. Masked entries (-inf) are 0."""
    hook = model.stage_hook_name(layer, stage)
    _, cache = model.run_with_cache(input, names_filter=hook, return_cache_object=False)
    maps = cache[hook][batch_index]
    if maps.ndim != 3:
        raise ValueError(f"{hook} is not a [head, query, key] map: shape "
                         f"{tuple(cache[hook].shape)}")
    maps = torch.where(torch.isfinite(maps), maps, torch.zeros_like(maps)).float()
    spec = next(s for s in model.stages(layer) if s.name == stage)
    if spec.row_stochastic:
        low, high = 0.0, 1.0
    else:
        high = float(maps.abs().max().clamp(min=1e-12))
        low = -high
    tokens = input if isinstance(input, str) else torch.as_tensor(input).reshape(
        -1, torch.as_tensor(input).shape[-1])[batch_index]
    return dict(attention=maps, tokens=model.to_str_tokens(tokens), min_value=low,
                max_value=high)


def abs_row_normalised(maps: Tensor) -> Tensor:
    """`|maps|` divided by each row's absolute mass: a distribution per row of where a signed
    map puts its weight (for detectors that need one; rows of zeros stay zero)."""
    mass = maps.abs().sum(-1, keepdim=True)
    return maps.abs() / torch.where(mass > 0, mass, torch.ones_like(mass))


__all__ = ["abs_row_normalised", "circuitsvis_args", "row_stochastic_stage", "stage_cache"]
