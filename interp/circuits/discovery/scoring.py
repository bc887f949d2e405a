"""Edge scores: attribution patching (first order), EAP-IG, and exact patching as ground truth.

Convention: a score estimates `metric(edge patched to the corrupted value) - metric(clean)`.

- `attribution_patching`: `(a_corrupt - a_clean) . grad(clean)` (Syed et al. 2023): one
  forward on the corrupted prompts, one forward + backward on the clean ones.
- `eap_ig`: the same difference times the gradient averaged over `steps` points of the straight
  line from the clean to the corrupted input embeddings (Hanna et al. 2024, EAP-IG on inputs;
  midpoint rule). Over all edges leaving the input this sums to the whole clean -> corrupted
  change as steps grow (completeness), which checks that the graph misses no reader.
- `edge_ig`: the integral along one edge's own path, clean -> patched (exact patching of that
  edge as steps grow; cost: steps forward + backward per edge; for checking or refining a few).
- `exact_patching`: the ground truth, one patched forward per edge.

Example:
    >>> graph = build_graph(model)                                            # doctest: +SKIP
    >>> scores = attribution_patching(model, graph, clean, corrupted, metric)  # doctest: +SKIP
    >>> scores.sort_values("abs_score", ascending=False).head()               # doctest: +SKIP
"""

from __future__ import annotations

import pandas as pd
import torch
from torch import Tensor

from attnlens.interp._common import check_int
from attnlens.interp.circuits.discovery.engine import Record, run
from attnlens.interp.circuits.discovery.graph import CircuitGraph, Edge


def _slot(t: Tensor, head: int | None) -> Tensor:
    return t if head is None else t[:, :, head]


def edge_scores(graph: CircuitGraph, ref: Record, base: Record, grad: Record) -> Tensor:
    """`[n_edges]`: (ref - base) of each edge's source, dotted with `grad`'s gradient at its
    destination (summed over batch, positions and features; divide-free: the metric averages)."""
    out = torch.zeros(len(graph.edges), dtype=torch.float64)
    resid = [(i, e) for i, e in enumerate(graph.edges) if e.kind == "resid"]
    srcs = list(dict.fromkeys(e.src for _, e in resid))
    dsts = list(dict.fromkeys((e.dst, e.port) for _, e in resid))
    if resid:
        U = torch.stack([ref.output(graph, s) - base.output(graph, s) for s in srcs])
        G = torch.stack([_slot(grad.grads[graph.inputs[d][0]], graph.inputs[d][1])
                         for d in dsts])
        U = U.expand(-1, G.shape[1], *U.shape[2:]) if U.shape[1] == 1 else U
        S = torch.einsum("ubpd,ibpd->ui", U.double(), G.double())
        si, di = {s: k for k, s in enumerate(srcs)}, {d: k for k, d in enumerate(dsts)}
        for i, e in resid:
            out[i] = S[si[e.src], di[(e.dst, e.port)]]
    for i, e in enumerate(graph.edges):
        if e.kind == "mix":
            spec = graph.mixing[(e.layer, e.port)]
            delta = ref.acts[spec.source][:, e.src_head] - base.acts[spec.source][:, e.src_head]
            M = grad.mixing[(e.layer, e.port)][..., e.src_head, e.dst_head]
            g = grad.grads[spec.target][:, e.dst_head]
            out[i] = (M * delta * g).double().sum()
        elif e.kind == "sub":
            hook = graph.subnodes[(e.layer, e.port)]
            delta = ref.acts[hook][:, :, e.src_head] - base.acts[hook][:, :, e.src_head]
            out[i] = (delta * grad.grads[hook][:, :, e.src_head]).double().sum()
    return out


def scores_table(graph: CircuitGraph, scores: Tensor, method: str) -> pd.DataFrame:
    """Tidy table: one row per edge (name, src, dst, kind, port, layer, score, abs_score)."""
    return pd.DataFrame({
        "edge": [e.name for e in graph.edges], "src": [e.src for e in graph.edges],
        "dst": [e.dst for e in graph.edges], "kind": [e.kind for e in graph.edges],
        "port": [e.port for e in graph.edges], "layer": [e.layer for e in graph.edges],
        "score": scores.tolist(), "abs_score": scores.abs().tolist(), "method": method})


def attribution_patching(model, graph: CircuitGraph, clean: Tensor, corrupted: Tensor,
                         metric) -> pd.DataFrame:
    """First-order edge scores `(a_corrupt - a_clean) . grad_clean` as a tidy table."""
    ref = run(model, graph, corrupted)
    base = run(model, graph, clean, metric, grads=True)
    return scores_table(graph, edge_scores(graph, ref, base, base), "attribution")


def eap_ig(model, graph: CircuitGraph, clean: Tensor, corrupted: Tensor, metric,
           steps: int = 10) -> pd.DataFrame:
    """EAP-IG scores: the edge difference times the gradient averaged over `steps` midpoints
    `alpha = (j + 1/2) / steps` between the clean (0) and corrupted (1) input embeddings."""
    check_int("steps", steps)
    ref = run(model, graph, corrupted)
    base = run(model, graph, clean)
    e_clean, e_corr = base.acts[graph.outputs["input"][0]], ref.acts[graph.outputs["input"][0]]
    total = torch.zeros(len(graph.edges), dtype=torch.float64)
    for j in range(steps):
        alpha = (j + 0.5) / steps
        point = run(model, graph, clean, metric, grads=True,
                    input_value=e_clean + alpha * (e_corr - e_clean))
        total += edge_scores(graph, ref, base, point)
    return scores_table(graph, total / steps, f"eap-ig({steps})")


def edge_ig(model, graph: CircuitGraph, clean: Tensor, corrupted: Tensor, metric,
            edges: list[Edge], steps: int = 10) -> pd.DataFrame:
    """Per-edge integrated gradients along the edge's own path (clean -> patched): tends to
    `exact_patching` of each edge as `steps` grows (midpoint rule)."""
    check_int("steps", steps)
    ref = run(model, graph, corrupted)
    base = run(model, graph, clean)
    index = graph.edge_index()
    rows = []
    for e in edges:
        total = 0.0
        for j in range(steps):
            point = run(model, graph, clean, metric, patch={e: (j + 0.5) / steps},
                        reference=ref, grads=True)
            total += float(edge_scores(graph, ref, base, point)[index[e.name]])
        rows.append({"edge": e.name, "score": total / steps})
    return pd.DataFrame(rows).assign(method=f"edge-ig({steps})")


def exact_patching(model, graph: CircuitGraph, clean: Tensor, corrupted: Tensor, metric,
                   edges: list[Edge], coefficient: float = 1.0) -> pd.DataFrame:
    """Ground truth: `metric(clean, edge patched by coefficient) - metric(clean)` per edge
    (coefficient 1: the corrupted value; a small one gives a finite difference)."""
    ref = run(model, graph, corrupted)
    clean_value = run(model, graph, clean, metric).metric
    rows = [{"edge": e.name,
             "score": run(model, graph, clean, metric, patch={e: coefficient},
                          reference=ref).metric - clean_value} for e in edges]
    return pd.DataFrame(rows).assign(method="exact")
