"""The induction task for circuit discovery: prompts, metric, and the known circuit to check.

Clean prompts are `[BOS] r r` (r random tokens); corrupted ones `[BOS] r' r` (the first copy
replaced), so nothing in the second copy can be predicted by induction. The metric is the mean
log-probability of the next token over the second copy (the positions an induction head can
predict). The expected circuit (Olsson et al. 2022): a previous-token head writes into the keys
of an induction head (K-composition), which writes the answer to the logits.

Example:
    >>> task = induction_task(model, n_prompts=16, half_len=10, seed=0)          # doctest: +SKIP
    >>> heads = induction_heads(model, task)  # {"previous_token": ["L0H1"], ...}  # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch
from torch import Tensor

from attnlens.interp._common import check_int, find_stage, to_distribution
from attnlens.interp.circuits.discovery.graph import CircuitGraph, Edge, head_node
from attnlens.interp.circuits.discovery.metrics import logprob_metric
from attnlens.interp.tasks.induction import repeated_tokens
from attnlens.interp.tools.heads import previous_token_scores, repeated_induction_scores


@dataclass
class Task:
    """Clean and corrupted token ids `[batch pos]`, the metric and a description."""

    clean: Tensor
    corrupted: Tensor
    metric: object
    half_len: int
    description: str


def induction_task(model, n_prompts: int = 16, half_len: int | None = None, seed: int = 0,
                   bos: int = 0) -> Task:
    """`[BOS] r r` vs `[BOS] r' r` with `n_prompts` prompts (seeded); `half_len` defaults to
    what fits the context (at most 10)."""
    check_int("n_prompts", n_prompts)
    half = min(10, (model.cfg.n_ctx - 1) // 2) if half_len is None else check_int("half_len",
                                                                                   half_len, 2)
    if 1 + 2 * half > model.cfg.n_ctx:
        raise ValueError(f"half_len={half} needs {1 + 2 * half} positions, more than "
                         f"n_ctx={model.cfg.n_ctx}")
    gen = torch.Generator().manual_seed(seed)
    clean = repeated_tokens(n_prompts, half, model.cfg.d_vocab, bos=bos, generator=gen)
    other = repeated_tokens(n_prompts, half, model.cfg.d_vocab, bos=bos, generator=gen)
    corrupted = clean.clone()
    corrupted[:, 1:1 + half] = other[:, 1:1 + half]
    metric = logprob_metric(clean, range(1 + half, 2 * half))
    return Task(clean.to(model.W_E.device), corrupted.to(model.W_E.device), metric, half,
                f"induction: {n_prompts} prompts [BOS] r r vs [BOS] r' r, |r| = {half}, "
                f"seed {seed}; metric: mean log-prob of the next token on the second copy")


@torch.no_grad()
def head_scores(model, task: Task) -> pd.DataFrame:
    """Previous-token and induction scores of every head on the clean prompts, from the
    effective pattern read as distributions (`to_distribution`: composed maps whose rows need
    not sum to 1 are clamped and renormalised). Tidy: layer, head, label, previous_token,
    induction."""
    _, cache = model.run_with_cache(task.clean, names_filter=lambda n: n.endswith("hook_pattern"))
    rows = []
    for layer in range(model.cfg.n_layers):
        pattern = to_distribution(cache["pattern", layer], find_stage(model, layer, "pattern"))
        prev = previous_token_scores(pattern)
        ind = repeated_induction_scores(pattern, task.half_len)
        rows += [{"layer": layer, "head": h, "label": head_node(layer, h),
                  "previous_token": float(prev[h]), "induction": float(ind[h])}
                 for h in range(model.cfg.n_heads)]
    return pd.DataFrame(rows)


def induction_heads(model, task: Task, minimum: float = 0.3) -> dict[str, list[str]]:
    """Heads whose previous-token / induction score is at least `minimum` and at least half the
    best head's: `{"previous_token": [...], "induction": [...]}` (labels like "L0H1")."""
    table = head_scores(model, task)
    out = {}
    for key in ("previous_token", "induction"):
        best = table[key].max()
        keep = table[(table[key] >= minimum) & (table[key] >= best / 2)]
        out[key] = keep.label.tolist()
    return out


def recovery(graph: CircuitGraph, scores: pd.DataFrame, circuit: list[Edge],
             heads: dict[str, list[str]]) -> dict[str, object]:
    """How much of the expected induction circuit `circuit` holds.

    Returns: the K-composition edges (previous-token head -> a later induction head's keys) in
    the circuit and their count among the possible ones, the best rank of such an edge by
    |score|, the induction heads writing to the logits in the circuit, the map edges in the
    circuit, `one_layer`: those of them in layer 0, which no earlier head can feed (the
    previous-token shift then happens inside the layer, e.g. in an MTA key-query kernel), and
    `recovered`: at least one K-composition edge and one induction head -> logits, or a
    one-layer induction head -> logits.
    """
    nodes = graph.nodes
    possible = [f"{p}->{i}.k" for p in heads["previous_token"] for i in heads["induction"]
                if nodes[p].layer < nodes[i].layer]
    names = [e.name for e in circuit]
    ranked = scores.sort_values("abs_score", ascending=False, kind="stable").edge.tolist()
    ranks = [ranked.index(e) + 1 for e in possible if e in ranked]
    k_comp = [e for e in possible if e in names]
    to_logits = [i for i in heads["induction"] if f"{i}->logits" in names]
    one_layer = [i for i in to_logits if nodes[i].layer == 0]
    return {"k_composition": k_comp, "k_composition_possible": len(possible),
            "best_k_composition_rank": min(ranks) if ranks else None,
            "induction_to_logits": to_logits,
            "map_edges": [e.name for e in circuit if e.kind != "resid"],
            "one_layer": one_layer,
            "recovered": (bool(k_comp) and bool(to_logits)) or bool(one_layer)}
