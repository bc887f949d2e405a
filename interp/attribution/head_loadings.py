"""Head loadings: each edge of an attribution graph split exactly across attention heads.

An edge `adjacency[t, s]` is the direct effect of source `s` on target `t` in the replacement
model (`attnlens.interp.attribution.replacement`), where every attention layer computes
`z = P v` with its effective pattern `P` frozen, so `t` is linear in the values `v`. Fix one
attention layer `l`. Every path from `s` to `t` either passes through layer `l`'s attention
(through exactly one of its heads: the heads add their outputs) or bypasses it. Hence, exactly,

    adjacency[t, s] = sum over heads h of heads[l, h] + bypass[l]        (for every layer l)

with

    heads[l, h] = sum over q, k of  g[t, l, q, h] . P[l, h, q, k] . dv[s, l, k, h]
    bypass[l]   = the edge in the replacement model with layer l's z cut from v (detached),

where `g[t, l, q, h] = d t / d z[l, q, h]` (every path after the layer) and
`dv[s, l, k, h] = d v[l, k, h] / d alpha_s` (every path before it, attention of earlier layers
included); both are exact in the linear replacement model: `g` by one backward pass per target,
`dv` as `v(alpha = e_s) - v(alpha = 0)` (the model is affine in the source scales). Under
grouped-query attention `v` is taken per query head (its key/value head repeated). "Exactly"
means: in float64 the per-head shares plus the bypass equal the graph's edge to rounding
(~1e-12); `tests/test_attribution_head_loadings.py` checks it on every variant, computing
`bypass` independently (a backward pass with the layer cut), not as the remainder.

MTA and DCMHA mix the heads' softmax maps after the softmax (MTA's post-softmax convolution and
head mixing, DCMHA's post-softmax Compose); with their dynamic weights held at the prompt's
values the effective pattern is linear in the softmax maps, `P[h] = sum over h' of P[h' -> h]`,
where `P[h' -> h]` is `P[h]` recomputed from head h''s softmax map alone. For those variants
`heads[l, h']` is indexed by the *source* head h' whose softmax map the mixing draws on (summed
over the output heads h it feeds), which is the head whose QK decided where to look
(`source_heads` is True). Pre-softmax mixing (MTA's key-query convolution and pre-softmax head
mixing, DCMHA's pre-softmax Compose) is a matter of the QK side:
`attnlens.interp.attribution.qk.pattern_sources(..., phase="pre")`.

A path through several attention layers counts in every layer it passes; the split is a cut
per layer (as circuit-tracer's open head-loadings pull request #114 defines it), never a sum
over layers. `top_heads` ranks heads by the |loading| they carry over the edges split, and
`qk_for_top_heads` attributes their scores at the (query, key) entry carrying the most of it.

Cost: one forward per `batch_size` sources, and (1 + n_layers) forward + backward passes per
`batch_size` targets; memory `n_sources x n_layers x pos x n_heads x d_head` for `dv`.

Example:
    >>> loads = head_loadings(model, tcs, graph, edge_mask=pruned.edge_mask)  # doctest: +SKIP
    >>> loads.heads[0]      # [n_layers n_heads]: the first edge's split      # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from attnlens.interp.attribution.replacement import (
    CleanRun,
    FrozenOutputs,
    alphas_like,
    clean_run,
    frozen_forward,
    frozen_hooks,
)

# post-softmax maps that MTA and DCMHA mix into their effective pattern (see module doc)
MIXED_SOFTMAX = {"mta": "hook_softmax", "dcmha": "hook_probs"}


@dataclass
class HeadLoadings:
    """Edges (`targets[i]`, `sources[i]`, node indices of the graph) split over heads.

    Attributes:
        heads: `[n_edges n_layers n_heads]` each head's share at each layer (module doc).
        bypass: `[n_edges n_layers]` the part of each edge that does not pass that layer's
            attention.
        edges: `[n_edges]` the edges as the replacement model gives them here.
        source_heads: True when heads are the source heads of a post-softmax mixing (MTA,
            DCMHA), False when they are the heads themselves.
    """

    targets: Tensor
    sources: Tensor
    heads: Tensor
    bypass: Tensor
    edges: Tensor
    source_heads: bool

    @property
    def n_layers(self) -> int:
        return self.heads.shape[1]

    def top_heads(self, n: int = 3) -> list[tuple[int, int, float]]:
        """The `n` heads carrying the most |loading| over the edges: (layer, head, total)."""
        mass = self.heads.abs().sum(0)
        order = mass.flatten().argsort(descending=True)[:n]
        return [(int(i) // mass.shape[1], int(i) % mass.shape[1], float(mass.flatten()[i]))
                for i in order if float(mass.flatten()[i]) > 0]


def _node_sources(graph, run: CleanRun, sources: list[int]):
    """Per source node, a function setting its scale in an `Alphas` row."""
    n_f, n_pos, n_layers = graph.n_features, graph.n_pos, graph.n_layers
    active = _active(run)
    setters = []
    for s in sources:
        if s < n_f:
            layer, pos, feature = graph.features[s].tolist()
            setters.append(("features", layer, active[(layer, pos, feature)]))
        elif s < n_f + n_layers * n_pos:
            setters.append(("errors", *divmod(s - n_f, n_pos)))
        elif s < n_f + n_layers * n_pos + n_pos:
            setters.append(("embed", s - n_f - n_layers * n_pos, None))
        else:
            raise ValueError(f"node {s} is a logit: logits are never sources")
    return setters


def _set(alphas, row: int, setter, value: float = 1.0) -> None:
    kind, a, b = setter
    if kind == "features":
        alphas.features[a][row, b] = value
    elif kind == "errors":
        alphas.errors[row, a, b] = value
    else:
        alphas.embed[row, a] = value


def _active(run: CleanRun) -> dict[tuple[int, int, int], int]:
    """(layer, pos, feature) -> its index among its layer's active features in `run`."""
    return {(layer, int(p), int(f)): i for layer in sorted(run.features)
            for i, (p, f) in enumerate(zip(*run.features[layer][:2], strict=True))}


def _check_graph(graph, run: CleanRun) -> None:
    """ValueError unless every feature of the graph is active on its prompt here (a graph of
    another model, other transcoders or another prompt)."""
    active = _active(run)
    if graph.n_pos != run.n_pos or any(tuple(r) not in active
                                       for r in graph.features.tolist()):
        raise ValueError("the graph's features are not this model's and transcoders' active "
                         "features on its prompt: pass the model and transcoders that built it")


def _v_names(model) -> list[str]:
    return [f"blocks.{layer}.attn.hook_v" for layer in range(model.cfg.n_layers)]


def _z_names(model) -> list[str]:
    return [f"blocks.{layer}.attn.hook_z" for layer in range(model.cfg.n_layers)]


def target_value(graph, transcoders, out, row: int, node: int) -> Tensor:
    """Target node `node`'s value on batch copy `row` of a frozen forward (the graph's
    targets: a feature's pre-activation, a logit minus the mean logit)."""
    if node < graph.n_features:
        layer, pos, f = graph.features[node].tolist()
        tc = transcoders[layer]
        return out.mlp_in[layer][row, pos].to(tc.W_enc.dtype) @ tc.W_enc[:, f] + tc.b_enc[f]
    first_logit = graph.n_nodes - graph.n_logits
    if node < first_logit:
        raise ValueError(f"node {node} is an error or embedding node: it is never a target")
    logits = out.logits[row, -1]
    return logits[graph.logit_tokens[node - first_logit]] - logits.mean()


@torch.no_grad()
def value_jacobians(model, run: CleanRun, graph, sources: list[int], batch_size: int = 32
                    ) -> Tensor:
    """`[n_sources n_layers pos n_heads d_head]`: d v / d alpha_s per layer (per query head)."""
    names = _v_names(model)
    setters = _node_sources(graph, run, sources)
    base = frozen_forward(model, run, alphas_like(run, 1, 0.0, False), read=names)
    out = []
    for start in range(0, len(sources), batch_size):
        chunk = setters[start:start + batch_size]
        alphas = alphas_like(run, len(chunk), 0.0, False)
        for row, setter in enumerate(chunk):
            _set(alphas, row, setter)
        live = frozen_forward(model, run, alphas, read=names).live
        dv = torch.stack([model.blocks[layer].attn.expand_kv(live[name] - base.live[name])
                          for layer, name in enumerate(names)], 1)
        for row, (kind, a, _) in enumerate(chunk):
            if kind != "embed":        # written after attention `a`: no layer <= a sees it
                dv[row, :a + 1] = 0    # (exactly 0, not the difference's rounding)
        out.append(dv)
    return torch.cat(out)


def _z_gradients(model, run, graph, transcoders, targets: list[int]) -> Tensor:
    """`[n_targets n_layers pos n_heads d_head]`: d target / d z per layer."""
    names = _z_names(model)
    alphas = alphas_like(run, len(targets))
    out = frozen_forward(model, run, alphas, read=names)
    values = torch.stack([target_value(graph, run.transcoders, out, i, t)
                          for i, t in enumerate(targets)])
    zs = [out.live[name] for name in names]
    grads = torch.autograd.grad(values.sum(), zs, allow_unused=True)
    return torch.stack([torch.zeros_like(z) if g is None else g
                        for z, g in zip(zs, grads, strict=True)], 1).detach()


def _bypass(model, run, graph, targets: list[int], setters_of: dict, sources_of: dict
            ) -> dict[tuple[int, int], list[float]]:
    """Per (target, source) edge, the edge with each layer's z cut from v, layer by layer."""
    result = {}
    for layer in range(model.cfg.n_layers):
        alphas = alphas_like(run, len(targets))
        store: dict = {}
        hooks = frozen_hooks(model, run, alphas, store=store)

        def cut(act, hook, layer=layer, store=store):
            # MTA's frozen group norm reads z from the store: cut it there too
            store[("z", layer)] = act.detach()
            return store[("z", layer)]

        hooks.append((f"blocks.{layer}.attn.hook_z", cut))
        with model.hooks(fwd_hooks=hooks):
            logits = model(run.tokens.expand(len(targets), -1))
        out = FrozenOutputs(logits=logits, live={}, mlp_in={
            k: store[("mlp_in", k)] for k in run.transcoders})
        values = torch.stack([target_value(graph, run.transcoders, out, i, t)
                              for i, t in enumerate(targets)])
        grads = torch.autograd.grad(values.sum(), alphas.tensors(), allow_unused=True)
        grads = dict(zip(("embed", "errors", *[("f", k) for k in sorted(alphas.features)]),
                         grads, strict=True))
        for row, t in enumerate(targets):
            for s in sources_of[t]:
                kind, a, b = setters_of[s]
                g = (grads[("f", a)] if kind == "features" else grads[kind])
                if g is None:
                    value = 0.0
                elif kind == "features":
                    value = float(g[row, b])
                elif kind == "errors":
                    value = float(g[row, a, b])
                else:
                    value = float(g[row, a])
                result.setdefault((t, s), []).append(value)
    return result


@torch.no_grad()
def pattern_parts(model, run: CleanRun, layer: int) -> tuple[Tensor, bool]:
    """`[n_src n_heads q k]` parts of layer `layer`'s effective pattern and whether they are a
    mixing's source heads: for MTA and DCMHA `parts[h', h] = P[h' -> h]` (module doc), else
    `parts[h, h] = P[h]` and 0 off the diagonal. `parts.sum(0)` is the effective pattern."""
    pattern = run.cache[f"blocks.{layer}.attn.hook_pattern"][0]
    n_heads = pattern.shape[0]
    hook = MIXED_SOFTMAX.get(model.cfg.attention)
    prefix = f"blocks.{layer}.attn."
    if hook is None or prefix + hook not in model.hook_dict:
        return torch.diag_embed(pattern.permute(1, 2, 0)).permute(2, 3, 0, 1), False
    eye = torch.eye(n_heads, dtype=pattern.dtype)

    def one_head_each(act, hook):
        return act[:1] * eye[:, :, None, None].to(act.dtype)

    store = {}

    def keep(act, hook):
        store["pattern"] = act

    with model.hooks(fwd_hooks=[(prefix + hook, one_head_each), (prefix + "hook_pattern", keep)]):
        model(run.tokens.expand(n_heads, -1), stop_at_layer=layer + 1)
    return store["pattern"].to(pattern.dtype), True


def head_loadings(model, transcoders, graph, edge_mask=None, run: CleanRun | None = None,
                  batch_size: int = 32) -> HeadLoadings:
    """Split the graph's edges over heads (module doc). `edge_mask` `[n_nodes n_nodes]` bool
    (`[target, source]`, e.g. a pruned graph's) chooses the edges; default: every nonzero
    edge. `graph` must have been built from `model` and `transcoders` on its tokens."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    n = graph.n_nodes
    keep = graph.adjacency != 0
    if edge_mask is not None:
        edge_mask = torch.as_tensor(edge_mask)
        if tuple(edge_mask.shape) != (n, n):
            raise ValueError(f"edge_mask must be [{n}, {n}] for this graph, got "
                             f"{list(edge_mask.shape)}")
        keep = keep & edge_mask.bool()
    run = run or clean_run(model, transcoders, graph.tokens[None])
    _check_graph(graph, run)
    targets_t, sources_t = keep.nonzero(as_tuple=True)
    targets, sources = targets_t.tolist(), sources_t.tolist()
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    dtype = graph.adjacency.dtype
    if not targets:
        empty = torch.zeros(0, n_layers, n_heads, dtype=dtype)
        return HeadLoadings(targets_t, sources_t, empty, torch.zeros(0, n_layers, dtype=dtype),
                            torch.zeros(0, dtype=dtype), False)
    uniq_s = sorted(set(sources))
    s_index = {s: i for i, s in enumerate(uniq_s)}
    dv = value_jacobians(model, run, graph, uniq_s, batch_size)
    parts, mixed = zip(*(pattern_parts(model, run, layer) for layer in range(n_layers)),
                       strict=True)
    setters_of = dict(zip(uniq_s, _node_sources(graph, run, uniq_s), strict=True))
    sources_of: dict[int, list[int]] = {}
    for t, s in zip(targets, sources, strict=True):
        sources_of.setdefault(t, []).append(s)
    uniq_t = list(sources_of)
    shares: dict[tuple[int, int], Tensor] = {}
    bypass: dict = {}
    for start in range(0, len(uniq_t), batch_size):
        chunk = uniq_t[start:start + batch_size]
        g = _z_gradients(model, run, graph, transcoders, chunk)    # [T L q h d]
        bypass.update(_bypass(model, run, graph, chunk, setters_of, sources_of))
        for row, t in enumerate(chunk):
            idx = torch.tensor([s_index[s] for s in sources_of[t]])
            per_layer = []
            for layer in range(n_layers):
                # a[h', k, h, d] = sum_q g[q, h, d] P[h' -> h][q, k]
                a = torch.einsum("qhd,xhqk->xkhd", g[row, layer], parts[layer].to(g.dtype))
                per_layer.append(torch.einsum("xkhd,skhd->sx", a, dv[idx, layer]))
            for j, s in enumerate(sources_of[t]):
                shares[(t, s)] = torch.stack([p[j] for p in per_layer])
    heads = torch.stack([shares[(t, s)] for t, s in zip(targets, sources, strict=True)])
    by = torch.tensor([bypass[(t, s)] for t, s in zip(targets, sources, strict=True)],
                      dtype=heads.dtype)
    return HeadLoadings(targets=targets_t, sources=sources_t, heads=heads.to(dtype),
                        bypass=by.to(dtype), edges=graph.adjacency[targets_t, sources_t],
                        source_heads=any(mixed))


def qk_for_top_heads(model, transcoders, graph, loadings: HeadLoadings, n: int = 2,
                     run: CleanRun | None = None) -> list:
    """`attnlens.interp.attribution.qk.attribute_qk` of the `n` heads carrying the most
    |loading|, each at the (query, key) entry of its pattern through which the split edges
    carry the most |loading| (for MTA and DCMHA, the entry of the mixed pattern it feeds)."""
    from attnlens.interp.attribution.qk import attribute_qk

    run = run or clean_run(model, transcoders, graph.tokens[None])
    result = []
    for layer, head, _ in loadings.top_heads(n):
        entry = _top_entry(model, run, graph, loadings, layer, head)
        if entry is None:
            continue
        query_pos, key_pos = entry
        result.append(attribute_qk(model, transcoders, None, layer, head, query_pos, key_pos,
                                   run=run))
    return result


def _top_entry(model, run, graph, loadings, layer, head) -> tuple[int, int] | None:
    """(query, key) of layer `layer` where head `head`'s share of the split edges is largest in
    |value| summed over the edges, among entries whose score is finite."""
    parts, _ = pattern_parts(model, run, layer)
    targets = sorted(set(loadings.targets.tolist()))
    sources = sorted(set(loadings.sources.tolist()))
    dv = value_jacobians(model, run, graph, sources)[:, layer]            # [S k h d]
    s_index = {s: i for i, s in enumerate(sources)}
    mass = torch.zeros(parts.shape[-2:], dtype=dv.dtype)
    g = _z_gradients(model, run, graph, run.transcoders, targets)[:, layer]  # [T q h d]
    t_index = {t: i for i, t in enumerate(targets)}
    p = parts[head].to(dv.dtype)                                         # [h q k]
    for t, s in zip(loadings.targets.tolist(), loadings.sources.tolist(), strict=True):
        gq = torch.einsum("qhd,khd->hqk", g[t_index[t]], dv[s_index[s]])
        mass += (gq * p).sum(0).abs()
    if not bool((mass > 0).any()):
        return None
    q, k = divmod(int(mass.flatten().argmax()), mass.shape[1])
    return q, k


def loadings_json(loadings: HeadLoadings, node_id: dict[int, str], kept=None) -> list[dict]:
    """JSON records of the loadings, one per edge kept: `{source, target, heads (n_layers
    lists of n_heads numbers), bypass (n_layers numbers)}`. `node_id` maps node index to its
    JSON id; `kept` (a set of (target, source) index pairs) keeps those edges only."""
    records = []
    for i, (t, s) in enumerate(zip(loadings.targets.tolist(), loadings.sources.tolist(),
                                   strict=True)):
        if (kept is not None and (t, s) not in kept) or t not in node_id or s not in node_id:
            continue
        records.append(dict(source=node_id[s], target=node_id[t],
                            heads=loadings.heads[i].tolist(), bypass=loadings.bypass[i].tolist()))
    return records


def qk_json(qk, node_id_of_source, n: int = 8) -> dict:
    """A QK attribution as JSON: the entry, the score, each side's bias and its `n` largest
    sources (`node_id_of_source` maps a source index, graph order, to its JSON id)."""
    def side(values):
        order = values.abs().argsort(descending=True)[:n]
        return [dict(node_id=node_id_of_source(int(i)), label=qk.labels[int(i)],
                     value=float(values[i])) for i in order if float(values[i]) != 0]
    return dict(layer=qk.layer, head=qk.head, query_pos=qk.query_pos, key_pos=qk.key_pos,
                stage=qk.stage, score=qk.score, query_bias=qk.query_bias,
                key_bias=qk.key_bias, query=side(qk.query_side), key=side(qk.key_side))


__all__ = ["MIXED_SOFTMAX", "HeadLoadings", "head_loadings", "loadings_json", "pattern_parts",
           "qk_for_top_heads", "qk_json", "target_value", "value_jacobians"]
