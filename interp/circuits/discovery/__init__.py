"""Automatic circuit discovery that understands composed heads: edge attribution patching
(first order and EAP-IG) over every variant's computational graph, with exact patching as the
ground truth, circuit extraction, faithfulness and a figure (issue 25; docs/circuit_discovery.md).

Modules: `graph` (nodes, edges), `mixing` (within-layer map edges), `switches` (the model's
per-head input switches), `engine` (one patched forward), `scoring`, `metrics`, `extract`,
`induction` (the induction task), `paper_tasks` (MTA's find-the-block and DCMHA's conjunction
on the zoo's paper-task models), `prompt_scores` (edge scores with per-prompt corruptions: the
sweep's `circuit` analysis), `figure`, `discover` (all in one call).
"""

from attnlens.interp.circuits.discovery.discover import Discovery, discover
from attnlens.interp.circuits.discovery.extract import (
    circuit_metric,
    faithfulness,
    faithfulness_curve,
    prune,
    select_edges,
)
from attnlens.interp.circuits.discovery.figure import circuit_figure
from attnlens.interp.circuits.discovery.graph import CircuitGraph, Edge, Node, build_graph
from attnlens.interp.circuits.discovery.induction import (
    head_scores,
    induction_heads,
    induction_task,
    recovery,
)
from attnlens.interp.circuits.discovery.metrics import (
    logit_diff_metric,
    logprob_metric,
    loss_metric,
)
from attnlens.interp.circuits.discovery.paper_tasks import conjunction_task_pair, find_block_task
from attnlens.interp.circuits.discovery.scoring import (
    attribution_patching,
    eap_ig,
    edge_ig,
    exact_patching,
)

__all__ = ["CircuitGraph", "Discovery", "Edge", "Node", "attribution_patching", "build_graph",
           "circuit_figure", "circuit_metric", "conjunction_task_pair", "discover", "eap_ig",
           "edge_ig", "exact_patching", "faithfulness", "faithfulness_curve", "find_block_task",
           "head_scores", "induction_heads",
           "induction_task", "logit_diff_metric", "logprob_metric", "loss_metric", "prune",
           "recovery", "select_edges"]
