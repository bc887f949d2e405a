"""Circuits from edge scores: top-k or threshold selection, pruning, and faithfulness.

A circuit is a set of edges. `prune` keeps those on some path from the input to the logits
(heads are reached through any of their inputs; a layer's shared attention input reaches all its
heads; a sub-node is reached with its head). `faithfulness` runs the clean prompts with every edge
outside the circuit patched to the reference (the corrupted prompts' activations, or their mean)
and compares the metric with the full model's.

Example:
    >>> circuit = select_edges(graph, scores, top_k=20)                      # doctest: +SKIP
    >>> faithfulness(model, graph, circuit, clean, corrupted, metric)        # doctest: +SKIP
    {'clean': -0.04, 'ablated': -3.1, 'circuit': -0.35, 'faithfulness': 0.9, ...}
"""

from __future__ import annotations

import pandas as pd
from torch import Tensor

from attnlens.interp._common import check_int
from attnlens.interp.circuits.discovery.engine import Record, run
from attnlens.interp.circuits.discovery.graph import CircuitGraph, Edge


def select_edges(graph: CircuitGraph, scores: pd.DataFrame, top_k: int | None = None,
                 threshold: float | None = None, prune_dangling: bool = True) -> list[Edge]:
    """A circuit from the ranking by |score|.

    With `top_k`: the shortest prefix of the ranking whose pruned circuit has at least `top_k`
    edges (all of them when pruning is off), so edges that connect nothing do not use up the
    budget. With `threshold`: every edge with |score| >= threshold, then pruned. Pruning
    (`prune`) keeps what lies on a path from the input to the logits. Ordered by |score|.
    """
    if (top_k is None) == (threshold is None):
        raise ValueError("give exactly one of top_k and threshold")
    order = scores.sort_values("abs_score", ascending=False, kind="stable")
    index = graph.edge_index()
    ranked = [graph.edges[index[name]] for name in order.edge]
    if threshold is not None:
        chosen = ranked[:int((order.abs_score >= float(threshold)).sum())]
        return prune(graph, chosen) if prune_dangling else chosen
    k = min(check_int("top_k", top_k), len(ranked))
    if not prune_dangling:
        return ranked[:k]
    lo, hi = k, len(ranked)          # pruned size grows with the prefix: bisect on it
    while lo < hi:
        mid = (lo + hi) // 2
        if len(prune(graph, ranked[:mid])) >= k:
            hi = mid
        else:
            lo = mid + 1
    return prune(graph, ranked[:lo])


def _implicit(graph: CircuitGraph) -> list[tuple[str, str]]:
    """Node-to-node links inside a layer that need no edge: the shared attention input reaches
    every head of its layer, a head reaches its sub-nodes."""
    links = []
    for node in graph.nodes.values():
        if node.kind == "attn_in":
            links += [(node.name, f"L{node.layer}H{h}") for h in range(graph.n_heads)]
        elif node.kind not in ("input", "head", "mlp", "logits"):
            links.append((f"L{node.layer}H{node.head}", node.name))
    return links


def prune(graph: CircuitGraph, edges: list[Edge]) -> list[Edge]:
    """`edges` that lie on a path input -> ... -> logits (order kept)."""
    links = [(e.src, e.dst) for e in edges if e.kind != "sub"] + _implicit(graph)
    forward = {"input"}
    changed = True
    while changed:
        changed = False
        for src, dst in links:
            if src in forward and dst not in forward:
                forward.add(dst)
                changed = True
    sub_links = [(e.src, e.dst) for e in edges if e.kind == "sub"]
    backward = {"logits"}
    changed = True
    while changed:
        changed = False
        for src, dst in links + sub_links:
            if dst in backward and src not in backward:
                backward.add(src)
                changed = True
    return [e for e in edges if e.src in forward and e.dst in backward]


def reference_record(model, graph: CircuitGraph, corrupted: Tensor, how: str = "corrupted"
                     ) -> Record:
    """The reference activations: the corrupted run's ("corrupted") or their batch mean
    ("mean", broadcast over the clean batch)."""
    if how not in ("corrupted", "mean"):
        raise ValueError(f"ablation={how!r}; choose 'corrupted' or 'mean'")
    rec = run(model, graph, corrupted)
    if how == "mean":
        rec.acts = {k: v.mean(0, keepdim=True) for k, v in rec.acts.items()}
    return rec


def circuit_metric(model, graph: CircuitGraph, edges: list[Edge], clean: Tensor, metric,
                   reference: Record) -> float:
    """The metric on `clean` with every edge outside `edges` patched to `reference`."""
    keep = {e.name for e in edges}
    patch = {e: 1.0 for e in graph.edges if e.name not in keep}
    return run(model, graph, clean, metric, patch=patch, reference=reference).metric


def faithfulness(model, graph: CircuitGraph, edges: list[Edge], clean: Tensor,
                 corrupted: Tensor, metric, ablation: str = "corrupted") -> dict[str, float]:
    """Metric of the full model ("clean"), of the empty circuit ("ablated": every edge
    patched), of the circuit, and `faithfulness = (circuit - ablated) / (clean - ablated)`
    (1: the circuit alone recovers the full model's behaviour; 0: no better than nothing)."""
    ref = reference_record(model, graph, corrupted, ablation)
    clean_value = run(model, graph, clean, metric).metric
    ablated = circuit_metric(model, graph, [], clean, metric, ref)
    circuit = circuit_metric(model, graph, edges, clean, metric, ref)
    gap = clean_value - ablated
    return {"clean": clean_value, "ablated": ablated, "circuit": circuit,
            "faithfulness": float("nan") if gap == 0 else (circuit - ablated) / gap,
            "edges": len(edges), "ablation": ablation}


def faithfulness_curve(model, graph: CircuitGraph, scores: pd.DataFrame, clean: Tensor,
                       corrupted: Tensor, metric, sizes=(5, 10, 20, 50),
                       ablation: str = "corrupted") -> pd.DataFrame:
    """Faithfulness of the pruned top-k circuit for each k in `sizes` (tidy table)."""
    ref = reference_record(model, graph, corrupted, ablation)
    clean_value = run(model, graph, clean, metric).metric
    ablated = circuit_metric(model, graph, [], clean, metric, ref)
    rows = []
    for k in sizes:
        edges = select_edges(graph, scores, top_k=min(k, len(graph.edges)))
        value = circuit_metric(model, graph, edges, clean, metric, ref)
        rows.append({"top_k": k, "edges": len(edges), "circuit": value,
                     "faithfulness": (value - ablated) / (clean_value - ablated)})
    return pd.DataFrame(rows)

