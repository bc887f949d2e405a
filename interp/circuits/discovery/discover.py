"""One call from a model and a task to a scored, extracted and checked circuit.

Example:
    >>> from attnlens.hooked_models import zoo
    >>> model = zoo.load("induction-mha")
    >>> result = discover(model, induction_task(model, n_prompts=8, seed=0), top_k=20)
    >>> result.faithfulness["faithfulness"] > 0.9
    True
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from attnlens.interp.circuits.discovery.extract import faithfulness, select_edges
from attnlens.interp.circuits.discovery.graph import CircuitGraph, Edge, build_graph
from attnlens.interp.circuits.discovery.induction import Task, induction_task  # noqa: F401 (doctest)
from attnlens.interp.circuits.discovery.scoring import attribution_patching, eap_ig

METHODS = ("eap-ig", "attribution")


@dataclass
class Discovery:
    """The graph, every edge's score, the extracted circuit and its faithfulness."""

    graph: CircuitGraph
    scores: pd.DataFrame
    circuit: list[Edge]
    faithfulness: dict[str, float]

    def top_edges(self, n: int = 15) -> pd.DataFrame:
        """The circuit's first `n` edges by |score| (edge, kind, score)."""
        names = {e.name for e in self.circuit}
        table = self.scores[self.scores.edge.isin(names)]
        return table.sort_values("abs_score", ascending=False).head(n)[
            ["edge", "kind", "score"]].reset_index(drop=True)


def discover(model, task: Task, method: str = "eap-ig", steps: int = 10, top_k: int | None = 20,
             threshold: float | None = None, ablation: str = "corrupted") -> Discovery:
    """Score every edge of `model`'s graph on `task` by `method` ("eap-ig" with `steps`, or
    "attribution"), keep the pruned `top_k` (or `threshold`) circuit and measure its
    faithfulness with the rest ablated by `ablation` ("corrupted" or "mean")."""
    if method not in METHODS:
        raise ValueError(f"method={method!r}; choose one of {list(METHODS)}")
    graph = build_graph(model)
    if method == "eap-ig":
        scores = eap_ig(model, graph, task.clean, task.corrupted, task.metric, steps)
    else:
        scores = attribution_patching(model, graph, task.clean, task.corrupted, task.metric)
    if threshold is not None:
        top_k = None
    circuit = select_edges(graph, scores, top_k=top_k, threshold=threshold)
    faith = faithfulness(model, graph, circuit, task.clean, task.corrupted, task.metric,
                         ablation)
    return Discovery(graph, scores, circuit, faith)
