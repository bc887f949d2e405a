"""Infini-attention views: memory vs local specialisation of each head (paper Sec. 4, Fig. 3).

Works on any model whose catalogue has a per-head `gate` stage, a memory read `a_mem`, the
memory read weights `mem_weights` and `z` (the stages of Infini-attention); other models raise
ValueError naming the missing stages.

- The gate g = sigmoid(beta) of each head is classified as in the paper: memory specialist
  (g >= 0.8), local specialist (g <= 0.2), mixer (|g - 0.5| <= 0.15), else intermediate.
- The memory contribution ratio `|g A_mem| / |A|` per head, with `A = z` the head output, is
  averaged over the tokens whose memory is non-empty (tokens after the first segment); the
  first segment has no memory and the gate is off there.

Example:
    >>> memory_specialisation(model, tokens)[["gate", "class", "memory_ratio"]]  # doctest: +SKIP
"""

from __future__ import annotations

import pandas as pd
import torch

from interp._common import as_tokens, check_layer, has_stage, head_label, run_cache
from interp.gating import classify_gate

NEEDED = ("gate", "a_mem", "mem_weights")
CLASS_NAMES = {"high": "memory specialist", "low": "local specialist", "mixer": "mixer",
               "intermediate": "intermediate"}


def memory_layers(model) -> list[int]:
    """Layers whose catalogue has the memory stages (`gate`, `a_mem`, `mem_weights`)."""
    return [layer for layer in range(model.cfg.n_layers)
            if all(has_stage(model, layer, n) for n in NEEDED)]


def memory_specialisation(model, tokens, **thresholds) -> pd.DataFrame:
    """One row per head of every memory layer: gate, class and memory contribution.

    Returns a DataFrame indexed by head label with `layer`, `head`, `gate` (mean sigmoid(beta)),
    `class` ("memory specialist", "local specialist", "mixer", "intermediate"),
    `memory_ratio` (mean over memory tokens of |g A_mem| / |z|), `memory_tokens` (how many
    tokens had a non-empty memory) and `local_ratio` (mean |(1 - g) A_dot| / |z| over the same
    tokens, when the catalogue has `a_dot`).
    """
    classify_gate(0.5, False, **thresholds)   # bad thresholds fail before the forward pass
    layers = memory_layers(model)
    if not layers:
        raise ValueError(f"this {model.cfg.attention!r} model has no layer with the stages "
                         f"{list(NEEDED)} (Infini-attention's memory gate and read)")
    tokens = as_tokens(model, tokens)
    names = []
    for layer in layers:
        stages = [*NEEDED, "z"] + (["a_dot"] if has_stage(model, layer, "a_dot") else [])
        names += [f"blocks.{layer}.attn.hook_{n}" for n in stages]
    store = run_cache(model, tokens, names)
    rows = []
    for layer in layers:
        def get(n, layer=layer):
            return store[f"blocks.{layer}.attn.hook_{n}"].double()

        g = get("gate")                                            # [batch head]
        a_mem, z = get("a_mem"), get("z")                          # [batch pos head d]
        has_mem = get("mem_weights").abs().sum(-1) > 0             # [batch head q]
        has_mem = has_mem.transpose(1, 2)                          # [batch q head]
        z_norm = z.norm(dim=-1).clamp(min=1e-12)
        mem_part = (g[:, None, :, None] * a_mem).norm(dim=-1) / z_norm
        local_part = None
        if f"blocks.{layer}.attn.hook_a_dot" in store:
            local_part = ((1 - g[:, None, :, None]) * get("a_dot")).norm(dim=-1) / z_norm
        for h in range(g.shape[1]):
            mask = has_mem[:, :, h]
            n = int(mask.sum())
            gate = float(g[:, h].mean())
            row = {"head_label": head_label(layer, h), "layer": layer, "head": h,
                   "gate": gate,
                   "class": CLASS_NAMES[classify_gate(gate, signed=False, **thresholds)],
                   "memory_ratio": float(mem_part[:, :, h][mask].mean()) if n else float("nan"),
                   "memory_tokens": n}
            if local_part is not None:
                row["local_ratio"] = (float(local_part[:, :, h][mask].mean()) if n
                                      else float("nan"))
            rows.append(row)
    return pd.DataFrame(rows).set_index("head_label")


def set_gates(model, values: torch.Tensor | float, layer: int | None = None) -> None:
    """Set every memory layer's (or one layer's) per-head gate to `values` via its `beta`.

    A convenience for experiments and tests: beta = logit(values). Raises ValueError if the
    layer has no `beta` parameter.
    """
    layers = memory_layers(model) if layer is None else [check_layer(model, layer)]
    v = torch.as_tensor(values)
    if not ((v >= 0) & (v <= 1)).all():   # NaN fails both comparisons
        raise ValueError(f"values={values!r}: gates must lie in [0, 1]")
    for x in layers:
        attn = model.blocks[x].attn
        if not hasattr(attn, "beta"):
            raise ValueError(f"layer {x} has no per-head gate parameter beta")
        v = torch.as_tensor(values, dtype=attn.beta.dtype).clamp(1e-6, 1 - 1e-6)
        with torch.no_grad():
            attn.beta.copy_(torch.logit(v).expand_as(attn.beta))
