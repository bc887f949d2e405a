"""Prune an attribution graph by influence on the output, as circuit-tracer does.

Influence (Ameisen et al. 2025, appendix on pruning): take the graph's absolute direct effects,
normalise each target's incoming weights to sum to 1, and sum the effects of paths of every
length onto the logit nodes, each logit weighted by its probability:
`influence = w_logits (A + A^2 + ...)` with `A` the normalised adjacency (the graph is acyclic,
so the series ends). Nodes: keep the most influential nodes until `node_threshold` of the
total influence (features and error nodes alike) is covered; embeddings and logits are always
kept. Edges: on the graph of kept nodes, score each edge by its normalised weight times the
influence of its target (logits: their probability), and keep the best until `edge_threshold`
of the total score is covered. Then, until nothing changes, a feature or error node left with
no kept edge out, or a feature with no kept edge in, is dropped with its edges.

Example:
    >>> pruned = prune(graph, node_threshold=0.8, edge_threshold=0.98)      # doctest: +SKIP
    >>> pruned.node_mask.sum(), pruned.edge_mask.sum()                     # doctest: +SKIP
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class PrunedGraph:
    """Boolean masks over a graph's nodes `[n_nodes]` and edges `[n_nodes n_nodes]`
    (`edge_mask[target, source]`), with the node influence used to choose them."""

    node_mask: Tensor
    edge_mask: Tensor
    node_influence: Tensor
    node_threshold: float
    edge_threshold: float


def normalized(adjacency: Tensor) -> Tensor:
    """|A| with each row (a target's incoming weights) scaled to sum to 1 (0 rows stay 0)."""
    a = adjacency.abs()
    return a / a.sum(1, keepdim=True).clamp(min=1e-30)


def path_influence(a: Tensor, weights: Tensor, max_length: int | None = None) -> Tensor:
    """`weights (a + a^2 + ...)`: each node's total effect on the weighted targets through
    paths of every length (a must be nilpotent, as an acyclic graph's is)."""
    step = weights @ a
    total = step.clone()
    for _ in range(max_length or a.shape[0]):
        step = step @ a
        if not step.any():
            return total
        total += step
    if step.abs().max() > 1e-12:
        raise ValueError("the graph has a cycle: path influence does not converge")
    return total


def coverage_cutoff(scores: Tensor, fraction: float) -> float:
    """The smallest score among the top scores that together cover `fraction` of the total."""
    ordered = scores.flatten().sort(descending=True).values
    total = ordered.sum()
    if total <= 0:
        return float("inf")
    covered = ordered.cumsum(0) / total
    index = min(int(torch.searchsorted(covered, torch.tensor(fraction, dtype=covered.dtype))),
                ordered.numel() - 1)
    return float(ordered[index])


def logit_weights(graph) -> Tensor:
    w = torch.zeros(graph.n_nodes, dtype=graph.adjacency.dtype)
    w[graph.n_nodes - graph.n_logits:] = graph.logit_probabilities.to(w.dtype)
    return w


def check_threshold(name: str, value) -> float:
    """`value` as a float if it is a real number in (0, 1] (a share of influence), else a
    ValueError naming it: True is not 1.0, nor "0.8" a number."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) \
            or not 0 < float(value) <= 1:
        raise ValueError(f"{name} must be in (0, 1] (a number: a share of the influence), got "
                         f"{value!r}")
    return float(value)


def prune(graph, node_threshold: float = 0.8, edge_threshold: float = 0.98) -> PrunedGraph:
    """Masks of the nodes and edges to keep (see the module doc)."""
    for name, value in (("node_threshold", node_threshold), ("edge_threshold", edge_threshold)):
        check_threshold(name, value)
    n_f, n = graph.n_features, graph.n_nodes
    always = n - graph.n_logits - graph.n_pos          # embeddings and logits from here on
    weights = logit_weights(graph)
    influence = path_influence(normalized(graph.adjacency), weights)
    node_mask = influence >= coverage_cutoff(influence, node_threshold)
    node_mask[always:] = True
    kept = graph.adjacency * node_mask[:, None] * node_mask[None, :]
    a = normalized(kept)
    target_weight = path_influence(a, weights) + weights
    edge_scores = a * target_weight[:, None]
    edge_mask = edge_scores >= coverage_cutoff(edge_scores[edge_scores > 0], edge_threshold)
    edge_mask &= kept != 0
    for _ in range(n):
        new = node_mask.clone()
        new[:always] &= edge_mask[:, :always].any(0)    # an edge out (features, errors)
        new[:n_f] &= edge_mask[:n_f].any(1)             # an edge in (features)
        edge_mask &= new[:, None] & new[None, :]
        if torch.equal(new, node_mask):
            break
        node_mask = new
    return PrunedGraph(node_mask=node_mask, edge_mask=edge_mask, node_influence=influence,
                       node_threshold=node_threshold, edge_threshold=edge_threshold)


__all__ = ["PrunedGraph", "check_threshold", "coverage_cutoff", "normalized", "path_influence",
           "prune"]
