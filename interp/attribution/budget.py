"""The budget of an attribution graph: how many features enter it and how much memory it may use.

A prompt of n tokens has about 64 n active features on the zoo's -l4mlp models (TopK 16 per
layer), and an exact graph holds one row per feature over every source: memory and time grow
with n^2 (512 tokens: 32,765 features, a 5 GB float32 adjacency). As circuit-tracer does
(`max_feature_nodes`), `attribute` therefore computes the logit rows first, estimates every
feature's influence on the logits from the rows known so far (`partial_influence`), computes the
rows of the most influential features not yet visited, refines the estimate, and stops at
`max_feature_nodes` features. What was left out is reported (`BudgetReport`), never dropped
silently.

`AttributionBudget` also carries a memory budget: the rows kept, the final adjacency and each
batch's forward and backward (`copy_bytes`, an estimate calibrated on the zoo models) must fit,
and the batch size is derived from what is left. A budget that cannot fit is a ValueError
before the rows are computed.

Example:
    >>> budget = AttributionBudget(max_feature_nodes=2048, memory="2GB")
    >>> budget.memory_bytes
    2000000000
"""

from __future__ import annotations

import numbers
import re
from dataclasses import dataclass, field

import torch
from torch import Tensor

DEFAULT_MAX_FEATURE_NODES = 2048
DEFAULT_MEMORY = "2GB"
MAX_BATCH = 64
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_memory(value) -> int | None:
    """Bytes from `value`: an int of bytes, or a text such as "2GB", "512MiB", "1.5 GB"; None
    (or "none", "unbounded") for no limit. ValueError naming the value otherwise."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"memory budget must be a size such as 2GB, got {value!r}")
    if isinstance(value, numbers.Integral):
        number, unit = int(value), ""
    elif isinstance(value, str):
        text = value.strip()
        if text.lower() in ("none", "unbounded"):
            return None
        match = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*([A-Za-z]*)", text)
        if not match or match.group(2).upper() not in _UNITS:
            raise ValueError(f"memory budget must be a size such as 2GB, 512MB or 1.5GiB, got "
                             f"{value!r}")
        number, unit = float(match.group(1)), match.group(2).upper()
    else:
        raise ValueError(f"memory budget must be a size such as 2GB, got "
                         f"{type(value).__name__}")
    size = int(number * _UNITS[unit])
    if size < 10**6:
        raise ValueError(f"memory budget {value!r} is under 1 MB: too small for any graph")
    return size


def check_max_feature_nodes(value) -> int | None:
    """`value` as a positive int or None (every active feature); ValueError otherwise."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"max_feature_nodes must be a positive int or None (every active "
                         f"feature), got {value!r}")
    return int(value)


@dataclass(frozen=True)
class AttributionBudget:
    """How much of a graph to build. `max_feature_nodes`: the most features in the graph (None:
    every active feature); `memory`: the bytes the rows, the adjacency and a batch's forward
    and backward may take (a size such as "2GB"; None: no limit)."""

    max_feature_nodes: int | None = DEFAULT_MAX_FEATURE_NODES
    memory: int | str | None = DEFAULT_MEMORY

    def __post_init__(self):
        check_max_feature_nodes(self.max_feature_nodes)
        parse_memory(self.memory)

    @property
    def memory_bytes(self) -> int | None:
        return parse_memory(self.memory)

    @classmethod
    def unbounded(cls) -> AttributionBudget:
        return cls(max_feature_nodes=None, memory=None)


def copy_bytes(model, n_pos: int, n_active: int, itemsize: int) -> int:
    """Estimated bytes one batch copy of the replacement model's forward + backward holds at
    its peak: the residual-stream activations kept for the backward (about 24 `d_model`
    vectors per layer and position), the decoder writes of the active features (built and
    differentiated per layer: 3 `d_model` vectors per feature), the expanded frozen patterns
    (2 per head, layer and position pair) and the gradients of every source's scale.
    Calibrated on text-mha-l4mlp and text-dcmha-l4mlp (docs/benchmarks.md); an estimate."""
    cfg = model.cfg
    d, layers, heads = cfg.d_model, cfg.n_layers, cfg.n_heads
    per_layer = 24 * n_pos * d + 2 * heads * n_pos * n_pos
    writes = 3 * (n_active // max(layers, 1) + 1) * d
    return itemsize * (layers * per_layer + writes + 4 * n_active + cfg.d_vocab * 4)


def stored_bytes(n_rows: int, n_sources: int, n_nodes: int, itemsize: int,
                 budgeted: bool) -> int:
    """Bytes of what the graph keeps: the adjacency `[n_nodes n_nodes]` and, when features
    are chosen by influence, the computed rows over every source `[n_rows n_sources]` (kept
    until the final adjacency is cut from them)."""
    rows = n_rows * n_sources if budgeted else 0
    return itemsize * (rows + n_nodes * n_nodes)


def plan_batch(budget: AttributionBudget, model, n_pos: int, n_active: int, n_rows: int,
               n_sources: int, n_nodes: int, itemsize: int, budgeted: bool,
               batch_size: int | None = None) -> int:
    """The batch size (copies per forward) that fits `budget` (at most MAX_BATCH), or
    `batch_size` when given and it fits. ValueError saying what does not fit and what to
    change, before any row is computed."""
    limit = budget.memory_bytes
    per_copy = copy_bytes(model, n_pos, n_active, itemsize)
    if limit is None:
        return batch_size or MAX_BATCH
    kept = stored_bytes(n_rows, n_sources, n_nodes, itemsize, budgeted)
    room = limit - kept
    if room < per_copy:
        raise ValueError(
            f"the graph does not fit the memory budget of {_size(limit)}: {n_pos} tokens, "
            f"{n_active} active features, {n_nodes} nodes need {_size(kept)} for the "
            f"adjacency{' and rows' if budgeted else ''} plus {_size(per_copy)} per batch copy; "
            "lower the node budget (max_feature_nodes / --max-features), shorten the prompt, "
            "or raise the memory budget")
    fits = int(room // per_copy)
    if batch_size is not None:
        if batch_size > fits:
            raise ValueError(f"batch_size {batch_size} needs about {_size(batch_size * per_copy)}"
                             f" per batch; {_size(room)} of the memory budget is left after the "
                             f"graph ({_size(kept)}): use batch_size <= {fits} or leave it unset")
        return batch_size
    return max(1, min(MAX_BATCH, fits))


def _size(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 1e6:.1f} MB"


def partial_influence(rows: Tensor, row_sums: Tensor, logit_rows: int, logit_weights: Tensor,
                      row_features: Tensor, n_features: int, max_depth: int,
                      chunk: int = 256) -> Tensor:
    """Each source's influence on the logits through the rows computed so far (circuit-tracer's
    partial influence): rows `[n logits first, then visited features, n_sources]` normalised
    by their absolute sums `row_sums`, logits weighted by `logit_weights`, followed through
    visited features for up to `max_depth` steps. `row_features[i]`: the feature (a column
    below `n_features`) that row `logit_rows + i` explains. Paths through features not visited
    are missing, so a left-out feature's estimate is a lower bound. Works `chunk` rows at a
    time so no second `[n n_sources]` tensor is made."""
    n_sources = rows.shape[1]

    def spread(weights: Tensor, first: int) -> Tensor:
        out = torch.zeros(n_sources, dtype=torch.float64)
        scaled = (weights / row_sums[first:first + len(weights)].clamp(min=1e-30))
        for s in range(0, len(weights), chunk):
            e = min(s + chunk, len(weights))
            block = rows[first + s:first + e].abs().to(torch.float64)
            out += scaled[s:e].to(torch.float64) @ block
        return out

    step = spread(logit_weights.to(torch.float64), 0)
    total = step.clone()
    for _ in range(max_depth):
        if len(row_features) == 0:
            break
        weights = step[row_features]
        if not weights.any():
            break
        step = spread(weights, logit_rows)
        total += step
    return total


@dataclass
class BudgetReport:
    """What the budget left out of a graph (nothing is truncated silently).

    Attributes:
        max_feature_nodes, memory_bytes: the budget asked for (None: unbounded).
        batch_size: the copies per forward used.
        n_active: active features on the prompt; n_selected: those in the graph.
        left_out: `[n_left 3]` (layer, pos, feature) of the active features left out, the
            most influential first; left_out_influence: their estimated influence `[n_left]`.
        influence_left_out: the left-out features' share of the estimated influence of every
            source node on the logits (a lower bound: paths through them are not followed).
        target_effect_left_out: the left-out features' share of the |direct effects| on the
            target logit (exact: the logit rows are computed over every source).
        dropped_effect: `[n_nodes]` per target, the sum of direct effects from left-out
            features, so `target = adjacency row sum + bias + dropped_effect` stays exact.
    """

    max_feature_nodes: int | None
    memory_bytes: int | None
    batch_size: int
    n_active: int
    n_selected: int
    left_out: Tensor = field(default_factory=lambda: torch.zeros(0, 3, dtype=torch.long))
    left_out_influence: Tensor = field(default_factory=lambda: torch.zeros(0))
    influence_left_out: float = 0.0
    target_effect_left_out: float = 0.0
    dropped_effect: Tensor | None = None

    @property
    def n_left_out(self) -> int:
        return self.n_active - self.n_selected

    def summary(self) -> str:
        cap = "all" if self.max_feature_nodes is None else str(self.max_feature_nodes)
        if not self.n_left_out:
            return (f"budget {cap} features: all {self.n_active} active features are in the "
                    "graph")
        return (f"budget {cap} features: {self.n_selected} of {self.n_active} active features "
                f"in the graph, {self.n_left_out} left out (estimated influence share "
                f"{self.influence_left_out:.1%}, {self.target_effect_left_out:.1%} of the "
                "|direct effects| on the target logit)")

    def to_json(self, top: int = 10) -> dict:
        """A JSON-ready summary with the `top` most influential features left out."""
        return dict(
            max_feature_nodes=self.max_feature_nodes, memory_bytes=self.memory_bytes,
            batch_size=self.batch_size, active_features=self.n_active,
            features_in_graph=self.n_selected, features_left_out=self.n_left_out,
            influence_left_out=float(self.influence_left_out),
            target_effect_left_out=float(self.target_effect_left_out),
            top_left_out=[dict(layer=int(l), pos=int(p), feature=int(f), influence=float(i))
                          for (l, p, f), i in zip(self.left_out[:top].tolist(),
                                                  self.left_out_influence[:top].tolist(),
                                                  strict=True)])


__all__ = ["AttributionBudget", "BudgetReport", "DEFAULT_MAX_FEATURE_NODES", "DEFAULT_MEMORY",
           "check_max_feature_nodes", "copy_bytes", "parse_memory", "partial_influence",
           "plan_batch", "stored_bytes"]
