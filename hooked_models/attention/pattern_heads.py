"""Head-selective `hook_pattern`: a hook on a few heads' maps costs those heads' maps only.

TransformerLens's issue 378: with a fused (flash) attention a hook on `hook_pattern` either gets
nothing or forces the whole `[batch head_index query_pos key_pos]` map of the layer. Here a
forward can say which heads' patterns it wants (`pattern_heads=`, accepted by `forward`,
`run_with_cache` and `run_with_hooks`); the layer's `hook_pattern` then carries
`[batch len(heads) query_pos key_pos]`, head axis in the order asked, on every path:

- fused path (docs/design.md contract 5): while `hook_pattern` is the only map stage observed,
  by forward hooks only, the layer still runs its fused kernel, keeps the row log-sum-exp and
  recomputes exactly the asked heads' maps from it (`attnlens.kernels.dispatch.head_maps`,
  query block by query block, so no tensor as large as the layer's `[H, T, T]` is ever built);
  a hook that edits them (returns a new tensor or edits in place) replaces those heads' z by
  `edited @ v` (contract 4), which is what the materialising path does with the edit;
- materialising path (backend "torch", float64, a KV cache, a variant without a pattern state,
  other map stages hooked): the layer builds its maps as always and the hook sees the asked
  heads' slice; an edit is written back into those heads.

Example:
    >>> logits, cache = model.run_with_cache(tokens, names_filter="blocks.1.attn.hook_pattern",
    ...                                      pattern_heads={1: [3]})       # doctest: +SKIP
    >>> cache["pattern", 1].shape    # [batch, 1 (head 3), query_pos, key_pos]  # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

import torch
from torch import Tensor
from transformer_lens.hook_points import HookPoint

from attnlens.hooked_models.attention.observe import is_observed

PatternHeads = Mapping[int, int | Sequence[int]] | int | Sequence[int] | None


class PatternHookPoint(HookPoint):
    """`hook_pattern`'s HookPoint: while `heads` (a LongTensor) is set, its hooks see only those
    heads (`x[:, heads]`) and an edit of them (a returned tensor or an in-place change) is
    copied back into the full map; with `heads` None it is a plain HookPoint."""

    heads: Tensor | None = None

    def __call__(self, x: Tensor) -> Tensor:
        heads = self.heads
        if heads is None or not is_observed(self):
            return super().__call__(x)
        chosen = x[:, heads.to(x.device)]
        version = chosen._version
        out = super().__call__(chosen)
        if out is chosen and chosen._version == version:
            return x
        return x.index_copy(1, heads.to(x.device), out.to(x.dtype))


def resolve_pattern_heads(model, pattern_heads: PatternHeads) -> dict[int, Tensor]:
    """`{layer: LongTensor of heads}` from `pattern_heads`; ValueError naming what is wrong.

    Accepted: `{layer: head or [heads]}` (negative layers count from the end), or a head / list
    of heads for every layer. Heads must be distinct ints in [0, n_heads).
    """
    if pattern_heads is None:
        return {}
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    if isinstance(pattern_heads, Mapping):
        items = list(pattern_heads.items())
    else:
        items = [(layer, pattern_heads) for layer in range(n_layers)]
    out = {}
    for layer, heads in items:
        if (isinstance(layer, bool) or not isinstance(layer, int)
                or not -n_layers <= layer < n_layers):
            raise ValueError(f"pattern_heads: layer {layer!r} is not an int in "
                             f"[{-n_layers}, {n_layers})")
        chosen = [heads] if isinstance(heads, int) else heads
        if isinstance(chosen, (str, bytes)) or not isinstance(chosen, Sequence) or not chosen:
            raise ValueError(f"pattern_heads[{layer}]: {heads!r} must be a head index or a "
                             "non-empty list of head indices")
        for h in chosen:
            if isinstance(h, bool) or not isinstance(h, int) or not 0 <= h < n_heads:
                raise ValueError(f"pattern_heads[{layer}]: head {h!r} is not an int in "
                                 f"[0, {n_heads})")
        if len(set(chosen)) != len(chosen):
            raise ValueError(f"pattern_heads[{layer}]: heads {list(chosen)} repeat")
        out[layer % n_layers] = torch.tensor(list(chosen), dtype=torch.long)
    return out


@contextmanager
def select_pattern_heads(model, pattern_heads: PatternHeads) -> Iterator[dict[int, Tensor]]:
    """Within the block, the chosen layers' `hook_pattern` carries only the chosen heads."""
    chosen = resolve_pattern_heads(model, pattern_heads)
    points = {layer: model.blocks[layer].attn.hook_pattern for layer in chosen}
    for layer, point in points.items():
        if not isinstance(point, PatternHookPoint):
            raise ValueError(f"layer {layer}'s hook_pattern cannot select heads "
                             f"({type(point).__name__})")
    previous = {layer: point.heads for layer, point in points.items()}
    try:
        for layer, point in points.items():
            point.heads = chosen[layer]
        yield chosen
    finally:
        for layer, point in points.items():
            point.heads = previous[layer]


def head_selected_only(attn) -> bool:
    """Whether the only observed map stage of `attn` is a head-selective `hook_pattern` with
    forward hooks only (a backward hook needs the map in the autograd graph: materialise)."""
    point = attn.hook_pattern
    if getattr(point, "heads", None) is None or not is_observed(point):
        return False
    if (point._backward_hooks or getattr(point, "_backward_pre_hooks", None)
            or getattr(point, "bwd_hooks", None)):
        return False
    return not any(is_observed(hp) for hp in attn.map_hooks() if hp is not point)


def fused_with_head_maps(attn, q: Tensor, k: Tensor, v: Tensor, ctx) -> Tensor | None:
    """z from `attn.fused_attend` with `hook_pattern` fired on the asked heads' exact maps, or
    None (nothing fired, nothing kept) when the fused kernel does not take this call."""
    from attnlens.kernels.dispatch import head_maps

    keep, attn.keep_fused_state = attn.keep_fused_state, True
    try:
        z = attn.fused_attend(q, k, v, ctx)
        state = attn.fused_state
    finally:
        attn.keep_fused_state = keep
        if not keep:
            attn.fused_state = None
    if z is None:
        return None
    if state is None or not hasattr(state, "pattern"):
        raise TypeError(f"{type(attn).__name__}.fused_attend kept no pattern state")
    point = attn.hook_pattern
    heads = point.heads.to(z.device)
    maps = head_maps(state, heads)
    version = maps._version
    out = HookPoint.__call__(point, maps)
    if out is maps and maps._version == version:
        return z
    if torch.is_grad_enabled() and z.requires_grad:
        raise ValueError(f"{point.name}: a hook edited the selected heads' pattern on the fused "
                         "path while gradients are on; the recomputed map carries no gradient "
                         "to q and k. Run under torch.no_grad(), or with backend='torch' for "
                         "gradients through an edited pattern")
    z = z.clone()
    z[:, :, heads] = torch.einsum("bhqk,bkhd->bqhd", out.to(v.dtype), v[:, :, heads])
    return z


__all__ = ["PatternHookPoint", "fused_with_head_maps", "head_selected_only",
           "resolve_pattern_heads", "select_pattern_heads"]
