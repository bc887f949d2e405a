"""Automatic circuit discovery that understands composed heads: edge attribution patching
(first order and EAP-IG) over every variant's computational graph, with exact patching as the
ground truth, circuit extraction, faithfulness and a figure (issue 25; docs/circuit_discovery.md).

Modules: `graph` (nodes, edges), `mixing` (within-layer map edges), `switches` (the model's
per-head input switches), `engine` (one patched forward), `scoring`, `metrics`, `extract`,
`induction` (the induction task), `figure`, `discover` (all in one call).
"""

from interp.circuit_discovery.discover import Discovery, discover
from interp.circuit_discovery.extract import (
    circuit_metric,
    faithfulness,
    faithfulness_curve,
    prune,
    select_edges,
)
from interp.circuit_discovery.figure import circuit_figure
from interp.circuit_discovery.graph import CircuitGraph, Edge, Node, build_graph
from interp.circuit_discovery.induction import (
    head_scores,
    induction_heads,
    induction_task,
    recovery,
)
from interp.circuit_discovery.metrics import logit_diff_metric, logprob_metric, loss_metric
from interp.circuit_discovery.scoring import (
    attribution_patching,
    eap_ig,
    edge_ig,
    exact_patching,
)

__all__ = ["CircuitGraph", "Discovery", "Edge", "Node", "attribution_patching", "build_graph",
           "circuit_figure", "circuit_metric", "discover", "eap_ig", "edge_ig", "exact_patching",
           "faithfulness", "faithfulness_curve", "head_scores", "induction_heads",
           "induction_task", "logit_diff_metric", "logprob_metric", "loss_metric", "prune",
           "recovery", "select_edges"]
