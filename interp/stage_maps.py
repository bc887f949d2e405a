"""Every map stage of a layer, in catalogue order, from one forward pass.

Example:
    >>> maps = stage_maps(model, tokens, layer=0)        # doctest: +SKIP
    >>> [(m.stage.name, tuple(m.values.shape)) for m in maps]
    [('attn_scores', (1, 4, 7, 7)), ('pattern', (1, 4, 7, 7))]
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hooked_models.attention import Stage


@dataclass
class StageMap:
    """One stage of one layer: its catalogue entry and the hooked tensor `[batch head q k]`."""

    layer: int
    stage: Stage
    values: torch.Tensor


def stage_maps(model, tokens: torch.Tensor, layer: int) -> list[StageMap]:
    """All map stages of `layer` (catalogue order) for `tokens`, caching only those hooks."""
    if not 0 <= layer < model.cfg.n_layers:
        raise ValueError(f"layer {layer} is outside [0, {model.cfg.n_layers})")
    stages = [s for s in model.stages(layer) if s.is_map]
    names = [model.stage_hook_name(layer, s) for s in stages]
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=names)
    return [StageMap(layer, s, cache[n]) for s, n in zip(stages, names, strict=True)]
