"""Within-layer map edges: which heads' maps mix into which, read from the model's mixing seam.

A layer mixes heads when its `head_mixing_at(source, t, s)` returns a matrix for a phase
("pre": the logits, "post": the weights), in the convention `mixed[m] = sum_n M[n, m] A[n]`
(`VariantAttention.head_mixing`). The catalogue says where: the mixing of a phase is the step
between the last two map stages of that phase (MTA: `pre_sm_conv -> pre_sm_mix`,
`post_sm_conv -> pattern`; DCMHA: `attn_scores -> composed_scores`, `probs -> pattern`).

Edge n -> m (n != m, M[n, m] not identically zero) carries `M[n, m] A_n` into head m's map;
patching it replaces head n's map by its corrupted value in that term only. Mixing that depends
on the input (the layer overrides `head_mixing_at`) is evaluated at every (query, key) pair from
the layer's non-map stages (e.g. DCMHA's dynamic weights) of the same forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from attnlens.hooked_models.attention.base import VariantAttention

PHASES = ("pre", "post")


@dataclass(frozen=True)
class MixingSpec:
    """One layer's mixing at one phase.

    Attributes:
        layer, phase: where.
        source, target: hook names of the map before and after the mixing.
        pairs: (n, m) head pairs, n != m, with an edge.
        dynamic: whether M depends on the input (then `context` lists the hooks it reads).
        context: hook names of the layer's non-map stages (read to evaluate a dynamic M).
    """

    layer: int
    phase: str
    source: str
    target: str
    pairs: tuple[tuple[int, int], ...]
    dynamic: bool
    context: tuple[str, ...]


def _phase_maps(model, layer: int, phase: str) -> list[str]:
    return [s.name for s in model.stages(layer) if s.is_map and s.softmax == phase]


def is_dynamic(attn) -> bool:
    """Whether the layer's mixing depends on its input (it overrides `head_mixing_at`)."""
    return type(attn).head_mixing_at is not VariantAttention.head_mixing_at


def mixing_specs(model) -> dict[tuple[int, str], MixingSpec]:
    """`{(layer, phase): MixingSpec}` for every layer and phase whose heads mix.

    Runs one two-token probe forward (caching the layers' non-map stages) to ask each layer's
    `head_mixing_at` which phases mix and which head pairs have nonzero weight.
    """
    out: dict[tuple[int, str], MixingSpec] = {}
    context = {layer: tuple(f"blocks.{layer}.attn.hook_{s.name}" for s in model.stages(layer)
                            if not s.is_map) for layer in range(model.cfg.n_layers)}
    names = [n for layer in context for n in context[layer]]
    tokens = torch.zeros(1, 2, dtype=torch.long, device=model.W_E.device)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names)
    for layer, block in enumerate(model.blocks):
        attn = block.attn
        probe = attn.head_mixing_at(dict(cache.items()), 1, 0)
        for phase in PHASES:
            M = probe.get(phase)
            maps = _phase_maps(model, layer, phase)
            if M is None or len(maps) < 2:
                continue
            # static: the pairs with weight; dynamic: the probe's block structure (groups)
            nonzero = M.detach().abs().sum(0) > 0
            H = M.shape[-1]
            pairs = tuple((n, m) for n in range(H) for m in range(H)
                          if n != m and bool(nonzero[n, m]))
            if not pairs:
                continue
            out[(layer, phase)] = MixingSpec(
                layer, phase, f"blocks.{layer}.attn.hook_{maps[-2]}",
                f"blocks.{layer}.attn.hook_{maps[-1]}", pairs, is_dynamic(attn), context[layer])
    return out


def mixing_tensors(model, layer: int, dynamic: bool, context: dict[str, Tensor],
                   n_pos: int) -> dict[str, Tensor | None]:
    """M of each phase for every (query, key) pair: `[batch query_pos key_pos head head]`
    (dynamic) or `[1 1 1 head head]` (static); `context` holds the layer's non-map stages."""
    attn = model.blocks[layer].attn
    if not dynamic:
        return {p: None if M is None else M[:, None, None]
                for p, M in attn.head_mixing_at(context, 0, 0).items()}
    grid: dict[str, list] = {}
    for t in range(n_pos):
        for s in range(t + 1):
            for p, M in attn.head_mixing_at(context, t, s).items():
                grid.setdefault(p, []).append(M)
    out: dict[str, Tensor | None] = {}
    rows, cols = torch.tril_indices(n_pos, n_pos)
    for p, mats in grid.items():
        if mats[0] is None:
            out[p] = None
            continue
        stacked = torch.stack(mats, 1)                       # [b pairs head head]
        full = stacked.new_zeros(stacked.shape[0], n_pos, n_pos, *stacked.shape[2:])
        full[:, rows, cols] = stacked       # keys after the query are masked: left at 0
        out[p] = full
    return out


def finite_map(A: Tensor) -> Tensor:
    """A map with its masked (-inf) entries as 0 (the value mixing reads there)."""
    return torch.where(torch.isfinite(A), A, torch.zeros_like(A))
