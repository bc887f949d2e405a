"""Pay for what you look at (docs/design.md contract 5): backend resolution and `patterns_for`.

A layer takes its fused kernel (`VariantAttention.fused_attend`) when `cfg.backend` allows it
(`fused_backend_enabled`) and no hook is attached to one of its map stages; otherwise it takes the
materialising torch path (`attend`). Hooks on q, k, v, z, result still fire on the fused path.

A fused state (one per op, e.g. `attnlens.kernels.flash_attention.dispatch.FlashState`) has
`n_heads`, `n_queries`, `device` and `pattern(heads, queries)` (LongTensors of indices).

`patterns_for` gives the exact `hook_pattern` rows of chosen layers, heads and queries without a
full materialising pass: a fused layer keeps its queries, keys and row log-sum-exp (O(T) extra),
and `pattern[i, j] = exp(score_ij - lse_i)` is recomputed for the chosen rows only.

Example (CUDA, or CPU with TRITON_INTERPRET=1):
    >>> model = HookedVariantTransformer(VariantConfig(..., backend="triton"))   # doctest: +SKIP
    >>> rows = patterns_for(model, tokens, layers=[1], heads=[0, 3], queries=[-1])  # doctest: +SKIP
    >>> rows[1].shape   # [batch, 2 heads, 1 query, key_pos]                       # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import Tensor

from attnlens.kernels import _triton

BACKENDS = ("torch", "triton", "auto")


def fused_backend_enabled(backend: str, t: Tensor) -> bool:
    """Whether `backend` runs the Triton kernels on tensors like `t`.

    "torch": never. "auto": only on CUDA tensors (and only when triton is installed).
    "triton": on CUDA, or anywhere under the CPU interpreter; otherwise ValueError naming why.
    """
    if backend == "torch":
        return False
    if backend == "auto":
        return t.is_cuda and _triton.available()
    if backend == "triton":
        if _triton.can_run(t):
            return True
        raise ValueError(f"backend='triton' cannot run here: {_triton.why_not(t)}; "
                         "use backend='auto' or 'torch' on CPU")
    raise ValueError(f"backend={backend!r}; choose one of {list(BACKENDS)}")


def _layers(model, layers) -> list[int]:
    n = model.cfg.n_layers
    if layers is None:
        return list(range(n))
    layers = [layers] if isinstance(layers, int) else list(layers)
    for layer in layers:
        if not isinstance(layer, int) or not -n <= layer < n:
            raise ValueError(f"layer {layer!r} is outside [0, {n})")
    return [layer % n for layer in layers]


def _index(sel, size: int, what: str, device) -> Tensor:
    """int / sequence of ints / slice / None -> LongTensor of indices in [0, size)."""
    if sel is None:
        return torch.arange(size, device=device)
    if isinstance(sel, int):
        sel = [sel]
    idx = torch.arange(size)[sel] if isinstance(sel, slice) else torch.as_tensor(list(sel))
    if idx.dtype != torch.long or (idx.numel() and not (-size <= int(idx.min())
                                                      and int(idx.max()) < size)):
        raise ValueError(f"{what} {sel!r} must be ints in [0, {size})")
    return (idx % size).to(device)


def capture_fused_state(model, inputs, layers: int | Iterable[int] | None = None,
                        **forward_kwargs) -> dict[int, Any]:
    """Run one forward (no grad, `return_type=None`) keeping each chosen layer's fused state.

    Returns `{layer: state}`; `state` is None for a layer that did not take a fused path
    (backend "torch", a map hook attached, a variant without kernels, an unsupported call).
    The states hold that layer's queries, keys and row log-sum-exp.
    """
    chosen = _layers(model, layers)
    attns = {layer: model.blocks[layer].attn for layer in chosen}
    try:
        for attn in attns.values():
            attn.keep_fused_state, attn.fused_state = True, None
        with torch.no_grad():
            model(inputs, return_type=None, **forward_kwargs)
        return {layer: attn.fused_state for layer, attn in attns.items()}
    finally:
        for attn in attns.values():
            attn.keep_fused_state, attn.fused_state = False, None


def patterns_for(model, inputs, layers: int | Iterable[int] | None = None,
                 heads: int | Sequence[int] | slice | None = None,
                 queries: int | Sequence[int] | slice | None = None,
                 **forward_kwargs) -> dict[int, Tensor]:
    """Exact `hook_pattern` rows: `{layer: [batch len(heads) len(queries) key_pos]}`.

    Args:
        model: a `HookedVariantTransformer`.
        inputs: what the model takes (string, strings, token ids), or the dict returned by
            `capture_fused_state` (then no forward runs at all).
        layers, heads, queries: ints, sequences, slices, or None for all. Queries index the
            input's positions (negative counts from the end).
        forward_kwargs: passed to the forward (e.g. `attention_mask`).

    A fused layer's rows come from its saved log-sum-exp: O(len(queries) * key_pos * d_head)
    per head, no `[query, key]` pass. Layers that ran unfused (backend "torch", a map hook
    attached, no kernel for the variant) fall back to one `run_with_cache` of their
    `hook_pattern`, sliced. The result equals `cache["pattern", layer][:, heads][:, :, queries]`.
    """
    saved = isinstance(inputs, dict)
    states = dict(inputs) if saved else capture_fused_state(model, inputs, layers,
                                                            **forward_kwargs)
    chosen = _layers(model, layers) if layers is not None or not saved else sorted(states)
    missing = [layer for layer in chosen if states.get(layer) is None]
    cached = {}
    if missing:
        if saved:
            raise ValueError(f"no fused state saved for layers {missing}; pass the inputs "
                             "instead to recompute them")
        names = [f"blocks.{layer}.attn.hook_pattern" for layer in missing]
        with torch.no_grad():
            _, cache = model.run_with_cache(inputs, names_filter=names, return_type=None,
                                            **forward_kwargs)
        cached = {layer: cache[name] for layer, name in zip(missing, names, strict=True)}
    out = {}
    for layer in chosen:
        if layer in cached:
            full = cached[layer]
            n_heads, n_q = full.shape[1], full.shape[2]
            h = _index(heads, n_heads, "heads", full.device)
            q = _index(queries, n_q, "queries", full.device)
            out[layer] = full[:, h][:, :, q]
        else:
            state = states[layer]
            h = _index(heads, state.n_heads, "heads", state.device)
            q = _index(queries, state.n_queries, "queries", state.device)
            out[layer] = state.pattern(h, q)
    return out


def head_maps(state, heads: Tensor, rows_per_block: int | None = None,
              ) -> Tensor:
    """The chosen heads' whole maps `[batch len(heads) query_pos key_pos]` from a fused state.

    The head-selective `hook_pattern` (`attnlens.hooked_models.attention.pattern_heads`) calls
    this: `state.pattern(heads, rows)` recomputes exact rows from the saved log-sum-exp, one
    block of query rows at a time. A variant whose heads mix (MTA, DCMHA) forms every head's
    logits of the block's rows, so by default a block holds `len(heads) * query_pos / n_heads`
    rows: that all-heads float32 transient is no larger than the result, and no tensor the size
    of the layer's `[head_index, query_pos, key_pos]` is ever built.
    """
    n_q, n_h = state.n_queries, state.n_heads
    if rows_per_block is None:
        like = getattr(state, "q", state.lse)
        rows_per_block = len(heads) * n_q * like.element_size() // (n_h * 4)
    block = max(1, min(n_q, rows_per_block))
    out = None
    for start in range(0, max(n_q, 1), block):   # one (empty) block when there is no query
        rows = torch.arange(start, min(start + block, n_q), device=state.device)
        part = state.pattern(heads, rows)
        if out is None:
            out = part.new_empty(part.shape[0], len(heads), n_q, part.shape[-1])
        out[:, :, start:start + len(rows)] = part
        del part
    return out


__all__ = ["BACKENDS", "capture_fused_state", "fused_backend_enabled", "head_maps",
           "patterns_for"]
