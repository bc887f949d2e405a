"""Every map stage of one layer, in catalogue order, from one forward pass (the stage explorer).

`attnlens.interp.tools.heads.stage_maps` is the transpose: one stage across layers.

Example:
    >>> maps = layer_stage_maps(model, tokens, layer=0)        # doctest: +SKIP
    >>> [(m.stage.name, tuple(m.values.shape)) for m in maps]
    [('attn_scores', (1, 4, 7, 7)), ('pattern', (1, 4, 7, 7))]
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from attnlens.hooked_models.attention import Stage
from attnlens.interp._common import check_layer, run_cache


@dataclass
class StageMap:
    """One stage of one layer: its catalogue entry and the hooked tensor `[batch head q k]`."""

    layer: int
    stage: Stage
    values: torch.Tensor


def layer_stage_maps(model, tokens: torch.Tensor, layer: int) -> list[StageMap]:
    """All map stages of `layer` (catalogue order) for `tokens`, caching only those hooks."""
    layer = check_layer(model, layer)
    stages = [s for s in model.stages(layer) if s.is_map]
    names = [model.stage_hook_name(layer, s) for s in stages]
    store = run_cache(model, tokens, names)
    return [StageMap(layer, s, store[n]) for s, n in zip(stages, names, strict=True)]
