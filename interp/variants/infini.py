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

from attnlens.interp._common import as_tokens, check_layer, has_stage, head_label, run_cache
from attnlens.interp.tools.gating import classify_gate

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


def memory_knockout_hooks(model) -> list:
    """Forward hooks zeroing the memory read A_mem of every layer: the output becomes
    (1 - gate) * local attention, i.e. what the model retrieves without its memory."""
    def zero(x, hook):
        return torch.zeros_like(x)

    return [(f"blocks.{layer}.attn.hook_a_mem", zero) for layer in range(model.cfg.n_layers)]


@torch.no_grad()
def _stream_qk(model, tokens: torch.Tensor, layers: list[int], chunk: int) -> dict:
    """`{(layer, "q"|"k"): [batch pos head d_head]}` over `tokens`, streamed when longer than
    the context (the memory reads and writes q, k before any rotary)."""
    names = [f"blocks.{layer}.attn.hook_{x}" for layer in layers for x in "qk"]
    parts: dict[str, list] = {n: [] for n in names}

    def keep(act, hook):
        parts[hook.name].append(act.detach())

    with model.hooks(fwd_hooks=[(n, keep) for n in names]):
        if tokens.shape[1] <= model.cfg.n_ctx:
            model(tokens)
        else:
            from attnlens.hooked_models.streaming import InfiniStream

            stream = InfiniStream(model)
            for i in range(0, tokens.shape[1], chunk):
                stream.feed(tokens[:, i:i + chunk])
    return {(int(n.split(".")[1]), n[-1]): torch.cat(parts[n], 1) for n in names}


@torch.no_grad()
def memory_source_share(model, tokens, queries: torch.Tensor, sources: torch.Tensor,
                        chunk: int = 4096) -> pd.DataFrame:
    """How much of each head's memory read at the `queries` comes from the `sources` tokens.

    The memory read of query i is `A_mem[i] = sum_j W[i, j] v_j` over the tokens j of earlier
    segments (the `mem_weights` stage). Its weights are `sigma(q_i).u_j / sigma(q_i).z` with
    `sigma = ELU + 1 > 0` and z the sum of every stored key's sigma(k): every token in the
    memory takes a positive share of the normaliser, so a source's share of the read shrinks
    as the memory fills unless the query singles it out. `u_j = sigma(k_j)` under the linear
    rule; the delta rule erodes it by each later segment's update, `u_j <- (I - B_s) u_j`.

    Args:
        tokens: `[batch pos]` ids of any length (streamed through `InfiniStream` past n_ctx).
        queries, sources: `[batch n_q]`, `[batch n_s]` positions; every source must lie in an
            earlier segment than every query of its row.

    Returns:
        One row per (layer, head, example): `share` (sum of the sources' read weights, averaged
        over the queries: the part of A_mem that comes from them), `share_no_erosion` (the same
        with u_j = sigma(k_j), i.e. what the share would be if the delta rule had not eroded
        the sources), `contrast` (mean weight of a source token over mean weight of any other
        memory token: how strongly the query singles the sources out), `memory_tokens` (tokens
        in the memory the queries read) and `gate` (sigmoid(beta)).

    Example:
        >>> memory_source_share(model, batch.tokens, answer_pos, key_pos)  # doctest: +SKIP
    """
    layers = memory_layers(model)
    if not layers:
        raise ValueError(f"this {model.cfg.attention!r} model has no Infini memory layer")
    tokens = as_tokens(model, tokens)
    queries, sources = torch.as_tensor(queries), torch.as_tensor(sources)
    b, T = tokens.shape
    if queries.shape[0] != b or sources.shape[0] != b:
        raise ValueError(f"queries {tuple(queries.shape)} and sources {tuple(sources.shape)} "
                         f"need one row per example ({b})")
    for name, pos in (("queries", queries), ("sources", sources)):
        if pos.numel() and (pos.min() < 0 or pos.max() >= T):
            raise ValueError(f"{name} must be positions in [0, {T}), got {pos.tolist()}")
    qk = _stream_qk(model, tokens, layers, chunk)
    rows = []
    for layer in layers:
        attn = model.blocks[layer].attn
        N, rule = attn.opts.segment_len, attn.opts.update
        seg_q, seg_s = queries // N, sources // N
        if not bool((seg_s.max(1).values < seg_q.min(1).values).all()):
            raise ValueError(f"every source must lie in an earlier {N}-token segment than every "
                             "query of its row (the memory holds earlier segments only)")
        sq = torch.nn.functional.elu(qk[layer, "q"].double()) + 1     # [b T H d]
        sk = torch.nn.functional.elu(qk[layer, "k"].double()) + 1
        H, d = sk.shape[2], sk.shape[3]
        for i in range(b):
            last = int(seg_q[i].min())           # the queries read M_{last - 1} (one segment)
            if int(seg_q[i].max()) != last:
                raise ValueError("all queries of a row must lie in one segment")
            src = sources[i]
            u = sk[i, src].clone()                                    # [n_s H d]
            z = sk.new_zeros(H, d)
            for s in range(last):
                ks = sk[i, s * N:(s + 1) * N]                          # [N H d]
                if rule == "delta" and s > 0:
                    later = seg_s[i] < s                               # sources already stored
                    c = torch.einsum("thd,hd->th", ks, z)[..., None].clamp(min=1e-300)
                    B = torch.einsum("thd,the->hde", ks / c, ks)
                    eroded = u - torch.einsum("nhd,hde->nhe", u, B)
                    u = torch.where(later[:, None, None], eroded, u)
                z = z + ks.sum(0)
            q = sq[i, queries[i]]                                      # [n_q H d]
            norm = torch.einsum("qhd,hd->qh", q, z)
            w = torch.einsum("qhd,nhd->qhn", q, u) / norm[..., None]
            w_plain = torch.einsum("qhd,nhd->qhn", q, sk[i, src]) / norm[..., None]
            n_mem = last * N
            mean_other = (1 - w_plain.sum(-1)) / max(n_mem - len(src), 1)
            for h in range(H):
                rows.append(dict(layer=layer, head=h, example=i,
                                 share=float(w[:, h].sum(-1).mean()),
                                 share_no_erosion=float(w_plain[:, h].sum(-1).mean()),
                                 contrast=float((w_plain[:, h].mean(-1)
                                                 / mean_other[:, h].clamp(min=1e-300)).mean()),
                                 memory_tokens=n_mem, gate=float(attn.gate[h])))
    return pd.DataFrame(rows)
