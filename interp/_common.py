"""Small helpers shared by the analyses: head labels, stage look-ups, caches and map transforms.

Everything here goes through the stage catalogue (`model.stages(layer)`), never through variant
names.

Example:
    >>> head_labels(model)[:3]                                   # doctest: +SKIP
    ['L0H0', 'L0H1', 'L0H2']
"""

from __future__ import annotations

import torch
from torch import Tensor

from hooked_models.attention import Stage

MAP_DIMS = ("batch", "head_index", "query_pos", "key_pos")


def head_label(layer: int, head: int) -> str:
    return f"L{layer}H{head}"


def head_labels(model, layers: list[int] | None = None) -> list[str]:
    """`["L0H0", "L0H1", ...]` for `layers` (all by default), layer-major."""
    layers = range(model.cfg.n_layers) if layers is None else layers
    return [head_label(layer, h) for layer in layers for h in range(model.cfg.n_heads)]


def check_layer(model, layer: int) -> int:
    if not isinstance(layer, int) or not 0 <= layer < model.cfg.n_layers:
        raise ValueError(f"layer {layer!r} is outside [0, n_layers={model.cfg.n_layers})")
    return layer


def check_head(model, head: int) -> int:
    if not isinstance(head, int) or not 0 <= head < model.cfg.n_heads:
        raise ValueError(f"head {head!r} is outside [0, n_heads={model.cfg.n_heads})")
    return head


def find_stage(model, layer: int, name: str) -> Stage:
    """The catalogue entry `name` of `layer`; ValueError listing the stages otherwise."""
    for s in model.stages(layer):
        if s.name == name:
            return s
    names = [s.name for s in model.stages(layer)]
    raise ValueError(f"layer {layer} ({model.cfg.attention}) has no stage {name!r}; "
                     f"stages: {names}")


def has_stage(model, layer: int, name: str) -> bool:
    return any(s.name == name for s in model.stages(layer))


def layers_with_stage(model, name: str) -> list[int]:
    return [layer for layer in range(model.cfg.n_layers) if has_stage(model, layer, name)]


def map_stage_names(model) -> list[str]:
    """Names of map stages (`[batch head q k]`) present in any layer, in catalogue order."""
    out: list[str] = []
    for layer in range(model.cfg.n_layers):
        for s in model.stages(layer):
            if s.is_map and s.name not in out:
                out.append(s.name)
    return out


def as_tokens(model, tokens) -> Tensor:
    """Token ids `[batch pos]` from a string, list of strings or ids (validated by the model)."""
    if isinstance(tokens, (str, list)):
        return model.to_tokens(tokens)
    return model._check_tokens(tokens)


def run_cache(model, tokens: Tensor, names: list[str], fwd_hooks=()) -> dict[str, Tensor]:
    """Forward `tokens` caching only `names` (no grad), with optional extra forward hooks."""
    store: dict[str, Tensor] = {}

    def save(t: Tensor, hook) -> None:
        store[hook.name] = t.detach()

    hooks = list(fwd_hooks) + [(n, save) for n in names]
    with torch.no_grad():
        model.run_with_hooks(tokens, return_type=None, fwd_hooks=hooks)
    return store


def attention_input_name(model, layer: int) -> str:
    """Hook holding the attention input x of `layer` (ln1 output, or resid_pre without norm)."""
    if model.cfg.normalization_type is None:
        return f"blocks.{layer}.hook_resid_pre"
    return f"blocks.{layer}.ln1.hook_normalized"


def to_distribution(maps: Tensor, stage: Stage) -> Tensor:
    """Rows of a map stage as distributions over keys.

    Pre-softmax stages go through a softmax over their finite entries (the attention the head
    would pay if every later step were the identity); row-stochastic stages are returned as they
    are; other post-softmax stages (MTA's convolved maps, DCMHA's composed weights: rows may be
    negative or not sum to one) are clamped at 0 and renormalised.
    """
    if stage.softmax == "pre":
        finite = torch.isfinite(maps)
        work = maps.masked_fill(~finite, float("-inf")).double()
        out = torch.softmax(work, dim=-1)
        return torch.where(finite.any(-1, keepdim=True), out, torch.zeros_like(out)).to(maps.dtype)
    if stage.row_stochastic:
        return maps
    pos = maps.clamp(min=0)
    return pos / pos.sum(-1, keepdim=True).clamp(min=torch.finfo(maps.dtype).tiny)
