"""Attention maps for interactive exploration: every head at one stage, one head at every stage,
prompt-set averages, thumbnails, and the closest stage of another variant.

Everything goes through the stage catalogue; nothing here knows a variant by name.

Example:
    >>> view = explore_maps(model, tokens, stage="pattern", layer=1)    # doctest: +SKIP
    >>> view.grid[0].shape, [s.name for s, _ in view.zoom]              # doctest: +SKIP
    (torch.Size([4, 41, 41]), ['attn_scores', 'pattern'])
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from attnlens.hooked_models.attention import Stage
from attnlens.interp._common import as_tokens, check_layer, run_cache


@dataclass
class ExploreView:
    """`grid[layer]`: `[head q k]` of the chosen stage (None where the layer lacks it);
    `zoom`: `(stage, [head q k])` for every map stage of the zoomed layer, catalogue order.
    Maps are averaged over the batch (the prompt set); -inf marks masked pairs."""

    stage: str
    layer: int
    grid: list[Tensor | None]
    zoom: list[tuple[Stage, Tensor]]


def map_stages(model, layer: int) -> list[Stage]:
    """The `[batch head q k]` stages of `layer`, catalogue order."""
    return [s for s in model.stages(check_layer(model, layer)) if s.is_map]


def find_map_stage(model, layer: int, name: str) -> Stage:
    """The map stage `name` of `layer`; ValueError listing the allowed names otherwise."""
    stages = map_stages(model, layer)
    for s in stages:
        if s.name == name:
            return s
    raise ValueError(f"stage {name!r} is not a map stage of layer {layer} "
                     f"({model.cfg.attention}); allowed: {[s.name for s in stages]}")


def closest_stage(model, layer: int, wanted: Stage) -> Stage:
    """`wanted` itself when `layer` has it, else the stage playing the same role.

    Roles come from the catalogue flags: a row-stochastic map -> the first row-stochastic stage
    (the plain softmax: MTA's softmax, DCMHA's probs, MHA's pattern); another post-softmax map ->
    the effective pattern; a pre-softmax map -> the last one (the logits entering the softmax);
    a map that is neither (CoPE's gates) -> the effective pattern.
    """
    stages = map_stages(model, layer)
    same = [s for s in stages if s.name == wanted.name]
    if same:
        return same[0]
    if wanted.row_stochastic:
        stochastic = [s for s in stages if s.row_stochastic]
        if stochastic:
            return stochastic[0]
    if wanted.softmax == "pre":
        pre = [s for s in stages if s.softmax == "pre"]
        if pre:
            return pre[-1]
    return find_map_stage(model, layer, "pattern")


def batched_prompts(model, prompts: list[str]) -> Tensor:
    """`[batch pos]` tokens of `prompts`, each cut to the shortest one's length.

    The models are causal, so cutting the input equals cutting every map to its leading block:
    the average over prompts then compares the same positions.
    """
    if not prompts:
        raise ValueError("prompts is empty; give at least one prompt")
    rows = [as_tokens(model, p)[0] for p in prompts]
    n = min(len(r) for r in rows)
    return torch.stack([r[:n] for r in rows])


def _mean_over_batch(maps: Tensor) -> Tensor:
    """`[head q k]` batch mean; masked (-inf) pairs stay -inf (the mask is the same per row)."""
    masked = torch.isneginf(maps).all(0)
    mean = maps.masked_fill(torch.isneginf(maps), 0.0).mean(0)
    return mean.masked_fill(masked, float("-inf"))


MapKey = tuple[int, str]   # (layer, stage name)


def view_keys(model, stage: str, layer: int) -> list[MapKey]:
    """The (layer, stage) maps `explore_maps` needs: `stage` in every layer that has it, then
    every map stage of `layer`. ValueError when no layer has `stage`."""
    keys = [(lay, stage) for lay in range(model.cfg.n_layers)
            if any(s.name == stage for s in map_stages(model, lay))]
    if not keys:
        raise ValueError(f"no layer of this {model.cfg.attention!r} model has a map stage "
                         f"{stage!r}; allowed: {[s.name for s in map_stages(model, 0)]}")
    return list(dict.fromkeys(keys + [(layer, s.name) for s in map_stages(model, layer)]))


def all_map_keys(model) -> list[MapKey]:
    """Every (layer, map stage) of the model, layer-major, catalogue order."""
    return [(lay, s.name) for lay in range(model.cfg.n_layers) for s in map_stages(model, lay)]


def map_bytes(model, keys: list[MapKey], n_tokens: int) -> int:
    """Bytes that the batch-mean maps of `keys` take for an input of `n_tokens` positions."""
    item = torch.empty((), dtype=model.cfg.dtype).element_size()
    return len(keys) * model.cfg.n_heads * n_tokens * n_tokens * item


def compute_maps(model, tokens: Tensor, keys: list[MapKey]) -> dict[MapKey, Tensor]:
    """One forward pass caching only the hooks of `keys`: `{(layer, stage): [head q k]}`,
    averaged over the batch (masked pairs stay -inf)."""
    names = {key: model.stage_hook_name(*key) for key in keys}
    cache = run_cache(model, tokens, list(dict.fromkeys(names.values())))
    return {key: _mean_over_batch(cache[name]) for key, name in names.items()}


def assemble_view(model, maps: dict[MapKey, Tensor], stage: str, layer: int) -> ExploreView:
    """The `ExploreView` of (`stage`, `layer`) from maps holding at least `view_keys(...)`."""
    grid = [maps.get((lay, stage)) for lay in range(model.cfg.n_layers)]
    zoom = [(s, maps[(layer, s.name)]) for s in map_stages(model, layer)]
    return ExploreView(stage, layer, grid, zoom)


def explore_maps(model, tokens: Tensor, stage: str, layer: int) -> ExploreView:
    """One forward pass caching `stage` in every layer that has it and every map stage of
    `layer`; maps averaged over the batch. ValueError when no layer has `stage`."""
    check_layer(model, layer)
    return assemble_view(model, compute_maps(model, tokens, view_keys(model, stage, layer)),
                         stage, layer)


def downsample(maps: Tensor, size: int) -> Tensor:
    """`[... q k]` block means onto at most `size` x `size` cells (masked pairs ignored; a fully
    masked block is NaN). Maps already that small are returned with -inf turned into NaN.

    Example:
        >>> downsample(torch.arange(16.).reshape(4, 4), 2)
        tensor([[ 2.5000,  4.5000],
                [10.5000, 12.5000]])
    """
    if size < 1:
        raise ValueError(f"size={size!r} must be >= 1")
    q, k = maps.shape[-2:]
    f = math.ceil(max(q, k) / size)
    if f == 1:
        work = maps.double()
        return work.masked_fill(~torch.isfinite(work), float("nan"))
    # Sums (accumulated in float64, so exact as the float64 block means) and counts of the
    # finite entries per block, one map at a time (a map stays in cache: a whole [head q k]
    # stack per pass is ~2x slower), each block reduced along queries (whole rows added, the
    # fast direction) then keys.
    qp, kp = math.ceil(q / f) * f, math.ceil(k / f) * f
    flat = maps.reshape(-1, q, k)
    sums = torch.empty(flat.shape[0], qp // f, kp // f, dtype=torch.float64)
    counts = torch.empty(flat.shape[0], qp // f, kp // f, dtype=torch.int32)
    for i, m in enumerate(flat):
        values = torch.nan_to_num(m, nan=0.0, posinf=0.0, neginf=0.0)
        finite = m.abs() < math.inf               # False exactly where m is -inf, inf or NaN
        if (qp, kp) != (q, k):
            pad = (0, kp - k, 0, qp - q)
            values, finite = F.pad(values, pad), F.pad(finite, pad)
        by_query = values.reshape(qp // f, f, kp).sum(1, dtype=torch.float64)
        sums[i] = by_query.reshape(qp // f, kp // f, f).sum(-1)
        n_query = finite.reshape(qp // f, f, kp).sum(1, dtype=torch.int32)
        counts[i] = n_query.reshape(qp // f, kp // f, f).sum(-1)
    means = torch.where(counts > 0, sums / counts.clamp(min=1), torch.full_like(sums, math.nan))
    return means.reshape(*maps.shape[:-2], qp // f, kp // f)


def row_and_column(map2d: Tensor, query: int, key: int) -> tuple[Tensor, Tensor]:
    """Query `query`'s row (weights over keys) and key `key`'s column (weights from queries)."""
    q, k = map2d.shape
    if not (0 <= query < q and 0 <= key < k):
        raise ValueError(f"(query, key)=({query}, {key}) is outside the {q} x {k} map")
    return map2d[query], map2d[:, key]


def downsample_labels(labels: list[str], size: int) -> list[str]:
    """Labels of `downsample(..., size)`'s cells: each block named by its first position
    ("8:c..", or the label itself when blocks are single positions)."""
    f = math.ceil(len(labels) / size)
    if f == 1:
        return list(labels)
    return [f"{labels[i]}..+{min(f, len(labels) - i)}" for i in range(0, len(labels), f)]
