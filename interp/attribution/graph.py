"""Attribution graphs: direct effects between features, embeddings, error nodes and logits.

Nodes, in circuit-tracer's order: the active transcoder features (layer, position, feature),
one error node per (layer, position), one embedding node per position, and the output logits
chosen (the most likely tokens at the last position until `logit_mass` of probability is
covered, at most `max_logits`; or the tokens asked for). `adjacency[target, source]` is the
direct effect of `source` on `target` in the replacement model
(`attnlens.interp.attribution.replacement`): on a feature, on its pre-activation; on a logit, on the
logit minus the mean logit (circuit-tracer's target). Since that model is linear in its sources,

    target value = sum over sources of adjacency[target, source] + bias[target]

exactly, where `bias` (the value with every source ablated) collects biases and norm offsets.

Cost: each row is one gradient. Rows are computed `batch_size` at a time: one replacement
forward over `batch_size` copies of the prompt and one backward, each copy seeded with its own
target, so a graph costs about `n_targets / batch_size` forward + backward passes of the model on
`batch_size x n_pos` tokens.

Example:
    >>> graph = attribute(model, transcoders, "def f(x): return x")        # doctest: +SKIP
    >>> pruned = prune(graph)                                              # doctest: +SKIP
"""

from __future__ import annotations

import copy
import numbers
from dataclasses import dataclass, field

import torch
from torch import Tensor

from attnlens.interp.attribution.budget import (
    AttributionBudget,
    BudgetReport,
    partial_influence,
    plan_batch,
)
from attnlens.interp.attribution.replacement import (
    CleanRun,
    alphas_like,
    check_prompt_text,
    clean_run,
    frozen_forward,
    prompt_tokens,
)
from attnlens.interp.sae.transcoder import Transcoder


@dataclass
class AttributionGraph:
    """A prompt's attribution graph (see the module doc for the node order and the identity).

    Attributes:
        features: `[n_features 3]` rows (layer, pos, feature index).
        activations: `[n_features]`.
        logit_tokens, logit_probabilities: `[n_logits]`; logit_token_strings: their text.
        adjacency: `[n_nodes n_nodes]`, `adjacency[target, source]`.
        target_values: `[n_nodes]` each target's value (feature pre-activation, demeaned
            logit; 0 for nodes that are not targets: errors and embeddings).
        bias: `[n_nodes]` the part of each target value no source explains.
    """

    prompt: str
    prompt_tokens: list[str]
    tokens: Tensor
    model_name: str
    n_layers: int
    features: Tensor
    activations: Tensor
    logit_tokens: Tensor
    logit_token_strings: list[str]
    logit_probabilities: Tensor
    adjacency: Tensor
    target_values: Tensor
    bias: Tensor
    target_logit: int = 0
    node_influence: Tensor | None = None
    feature_labels: dict = field(default_factory=dict)
    transcoder_set: str = ""
    budget: BudgetReport | None = None

    @property
    def n_pos(self) -> int:
        return len(self.prompt_tokens)

    @property
    def n_features(self) -> int:
        return self.features.shape[0]

    @property
    def n_errors(self) -> int:
        return self.n_layers * self.n_pos

    @property
    def n_logits(self) -> int:
        return self.logit_tokens.shape[0]

    @property
    def n_nodes(self) -> int:
        return self.n_features + self.n_errors + self.n_pos + self.n_logits

    def error_index(self, layer: int, pos: int) -> int:
        return self.n_features + layer * self.n_pos + pos

    def embedding_index(self, pos: int) -> int:
        return self.n_features + self.n_errors + pos

    def logit_index(self, i: int) -> int:
        return self.n_features + self.n_errors + self.n_pos + i

    def feature_index(self, layer: int, pos: int, feature: int) -> int:
        hit = ((self.features[:, 0] == layer) & (self.features[:, 1] == pos)
               & (self.features[:, 2] == feature)).nonzero()
        if hit.numel() == 0:
            raise KeyError(f"feature {feature} is not active at layer {layer}, position {pos}")
        return int(hit[0, 0])

    def node_kind(self, index: int) -> str:
        if index < self.n_features:
            return "feature"
        if index < self.n_features + self.n_errors:
            return "error"
        if index < self.n_features + self.n_errors + self.n_pos:
            return "embedding"
        return "logit"

    def node_label(self, index: int) -> str:
        kind = self.node_kind(index)
        if kind == "feature":
            layer, pos, feat = self.features[index].tolist()
            return f"L{layer} F{feat} @{pos} {self.prompt_tokens[pos]!r}"
        if kind == "error":
            layer, pos = divmod(index - self.n_features, self.n_pos)
            return f"L{layer} error @{pos} {self.prompt_tokens[pos]!r}"
        if kind == "embedding":
            pos = index - self.n_features - self.n_errors
            return f"embed @{pos} {self.prompt_tokens[pos]!r}"
        i = index - self.n_features - self.n_errors - self.n_pos
        return f"logit {self.logit_token_strings[i]!r} (p={float(self.logit_probabilities[i]):.3f})"

    def error_share(self, target: int | None = None) -> float:
        """The share of |direct effects| into `target` (default: the target logit) that comes
        from error nodes: what the transcoders do not explain on that step."""
        row = self.adjacency[self.logit_index(self.target_logit) if target is None else target]
        errors = row[self.n_features:self.n_features + self.n_errors].abs().sum()
        return float(errors / row.abs().sum().clamp(min=1e-30))


def token_strings(model, ids) -> list[str]:
    """The text of each token id (its id in angle brackets when the model has no tokenizer)."""
    ids = [int(i) for i in ids]
    if model.tokenizer is None:
        return [f"<{i}>" for i in ids]
    return [model.to_str_tokens(torch.tensor([i]))[0] for i in ids]


def resolve_targets(model, targets) -> Tensor | None:
    """`targets` (a token id, the text of one token, or a non-empty list of them; None: the
    likeliest tokens) as a `[n]` tensor of distinct token ids. ValueError naming the bad one:
    an empty list, a float or bool (1.7 is no token id), a text of more or fewer than one
    token, an id outside the vocabulary, or a token asked for twice (two logit nodes with one
    id would collide in the graph and in its JSON)."""
    if targets is None:
        return None
    d_vocab = int(getattr(model.cfg, "d_vocab_out", -1) or -1)
    d_vocab = d_vocab if d_vocab > 0 else int(model.cfg.d_vocab)
    if isinstance(targets, (str, numbers.Integral, Tensor)) and not (
            isinstance(targets, Tensor) and targets.ndim > 0):
        items = [targets]
    elif isinstance(targets, (list, tuple, Tensor)):
        items = list(targets)
    else:
        raise ValueError("targets must be a token id, the text of one token or a list of them, "
                         f"got {type(targets).__name__}")
    if not items:
        raise ValueError("targets is empty: give at least one token (or None for the likeliest "
                         "tokens)")
    ids = []
    for t in items:
        if isinstance(t, Tensor) and t.ndim == 0 and not t.dtype.is_floating_point \
                and t.dtype != torch.bool:
            t = int(t)
        if isinstance(t, str):
            tok = model.to_tokens(check_prompt_text(t, f"target {t!r}"), prepend_bos=False)[0]
            if tok.numel() != 1:
                pieces = model.to_str_tokens(t, prepend_bos=False)
                raise ValueError(f"target {t!r} is {tok.numel()} tokens; give one token "
                                 f"(the model's tokens for it: {pieces})")
            t = int(tok[0])
        elif isinstance(t, bool) or not isinstance(t, numbers.Integral):
            raise ValueError(f"target {t!r} is a {type(t).__name__}: give a token id (int) or "
                             "the text of one token")
        if not 0 <= int(t) < d_vocab:
            raise ValueError(f"target token id {t} is outside the vocabulary "
                             f"(0 .. {d_vocab - 1})")
        ids.append(int(t))
    repeated = sorted({i for i in ids if ids.count(i) > 1})
    if repeated:
        names = ", ".join(f"{i} {token_strings(model, [i])[0]!r}" for i in repeated)
        raise ValueError(f"targets ask for the same token more than once ({names}): each "
                         "logit node needs its own token")
    return torch.tensor(ids, dtype=torch.long)


def choose_logits(run: CleanRun, model, targets=None, logit_mass: float = 0.95,
                  max_logits: int = 10) -> tuple[Tensor, Tensor]:
    """(tokens, probabilities) of the logit nodes at the last position."""
    probs = torch.softmax(run.logits[0, -1].double(), -1)
    tokens = resolve_targets(model, targets)
    if tokens is not None:
        return tokens, probs[tokens]
    order = probs.argsort(descending=True)
    mass = probs[order].cumsum(0)
    n = min(max_logits, int((mass < logit_mass).sum()) + 1)
    return order[:n], probs[order[:n]]


def attribute(model, transcoders: dict[int, Transcoder], prompt, targets=None,
              logit_mass: float = 0.95, max_logits: int = 10, batch_size: int | None = None,
              progress: bool = False, model_name: str = "", transcoder_set: str = "",
              budget: AttributionBudget | None = None, dtype: torch.dtype | None = None,
              callback=None) -> AttributionGraph:
    """The attribution graph of `prompt` (a str or `[1 pos]` token ids; see the module doc).
    `targets`: distinct token ids or one-token strings for the logit nodes (default: the
    likeliest tokens; see `resolve_targets`). `transcoders`: one per layer, each at the layer
    it was trained for.

    `budget` (default `AttributionBudget()`: 2,048 features, 2 GB): when the prompt has more
    active features than `budget.max_feature_nodes`, the features are chosen by influence on
    the logits, estimated from the logit rows and refined as feature rows come in
    (`attnlens.interp.attribution.budget`); `graph.budget` says what was left out. When the
    budget covers every active feature the graph is the exact full graph. `batch_size`:
    copies per forward (default: derived from the memory budget). `dtype`: run in a copy of
    the model in this dtype (torch.float32 or torch.float64; default the model's own): use
    float64 for exact identities (~1e-12 against ~1e-5 in float32). `callback(done, total)`:
    called after each batch of rows (a job runner's progress; an exception it raises, such
    as a cancellation, stops the graph)."""
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(
            batch_size, int) or batch_size < 1):
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    budget = AttributionBudget() if budget is None else budget
    if not isinstance(budget, AttributionBudget):
        raise ValueError(f"budget must be an AttributionBudget, got {type(budget).__name__}")
    model = _in_dtype(model, dtype)
    # every argument is checked before the clean run and the rows (the expensive part)
    tokens = prompt_tokens(model, prompt)
    targets = resolve_targets(model, targets)
    run = clean_run(model, transcoders, tokens)
    logit_tokens, logit_probs = choose_logits(run, model, targets, logit_mass, max_logits)
    layers = sorted(run.features)
    feats = torch.cat([torch.stack([torch.full_like(run.features[layer][0], layer),
                                    run.features[layer][0], run.features[layer][1]], -1)
                       for layer in layers]) if layers else torch.zeros(0, 3, dtype=torch.long)
    acts = torch.cat([run.features[layer][2] for layer in layers])
    n_active, n_pos, n_layers = feats.shape[0], run.n_pos, model.cfg.n_layers
    n_logits = len(logit_tokens)
    cap = budget.max_feature_nodes
    n_f = n_active if cap is None else min(n_active, cap)
    budgeted = n_f < n_active
    n_sources = n_active + n_layers * n_pos + n_pos
    n_nodes = n_f + n_layers * n_pos + n_pos + n_logits
    dtype = run.errors[0].dtype
    batch = plan_batch(budget, model, n_pos, n_active, n_logits + n_f, n_sources, n_nodes,
                       dtype.itemsize, budgeted, batch_size)
    rows = _RowMaker(model, transcoders, run, feats, logit_tokens, layers, dtype)
    bar = _Progress(n_logits + n_f, progress, callback)
    try:
        if budgeted:
            adjacency, target_values, chosen, report = _budgeted(
                rows, budget, batch, n_f, n_nodes, probs=logit_probs, bar=bar)
        else:
            adjacency, target_values = _full(rows, batch, n_nodes, bar)
            chosen = torch.arange(n_active)
            report = BudgetReport(cap, budget.memory_bytes, batch, n_active, n_active)
    finally:
        bar.close()
    # the bias: every target's value with all sources ablated (alphas 0), one forward
    bias = torch.zeros(n_nodes, dtype=dtype)
    target_rows = list(range(n_f)) + [n_nodes - n_logits + i for i in range(n_logits)]
    with torch.no_grad():
        out = frozen_forward(model, run, alphas_like(run, 1, 0.0, False), detach_scores=True)
        bias[target_rows] = rows.values(out, [("feature", int(j)) for j in chosen] +
                                        [("logit", i) for i in range(n_logits)], copy=0)
    prompt_text = prompt if isinstance(prompt, str) else ""
    return AttributionGraph(
        prompt=prompt_text, prompt_tokens=token_strings(model, run.tokens[0]),
        tokens=run.tokens[0], model_name=model_name or model.cfg.metadata.get("recipe", ""),
        n_layers=n_layers, features=feats[chosen], activations=acts[chosen],
        logit_tokens=logit_tokens, logit_token_strings=token_strings(model, logit_tokens),
        logit_probabilities=logit_probs, adjacency=adjacency, target_values=target_values,
        bias=bias, transcoder_set=transcoder_set, budget=report)


class _Progress:
    """Rows done: a tqdm bar (`show`) and/or `callback(done, total)` after each batch."""

    def __init__(self, total: int, show: bool, callback):
        self.total, self.done, self.callback, self.bar = total, 0, callback, None
        if show:
            from tqdm.auto import tqdm
            self.bar = tqdm(total=total, desc="attribution rows", unit="row")

    def update(self, n: int) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
        if self.callback is not None:
            self.callback(self.done, self.total)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _in_dtype(model, dtype):
    """`model`, or an eval copy of it in `dtype` (float32 or float64)."""
    if dtype is None or dtype == model.cfg.dtype:
        return model
    if dtype not in (torch.float32, torch.float64):
        raise ValueError(f"dtype must be torch.float32 or torch.float64, got {dtype!r}")
    return copy.deepcopy(model).to(dtype).eval()


class _RowMaker:
    """Adjacency rows over every source (active features, errors, embeddings) for a list of
    targets, one replacement forward + backward over one copy of the prompt per target."""

    def __init__(self, model, transcoders, run: CleanRun, feats, logit_tokens, layers, dtype):
        self.model, self.transcoders, self.run = model, transcoders, run
        self.feats, self.logit_tokens, self.layers, self.dtype = feats, logit_tokens, layers, dtype

    def values(self, out, chunk, copy: int | None = None) -> Tensor:
        """Each target's value: on copy i for chunk[i], or all on copy `copy`."""
        vals = []
        for i, (kind, j) in enumerate(chunk):
            i = i if copy is None else copy
            if kind == "feature":
                layer, pos, f = self.feats[j].tolist()
                tc = self.transcoders[layer]
                x = out.mlp_in[layer][i, pos]
                vals.append(x.to(tc.W_enc.dtype) @ tc.W_enc[:, f] + tc.b_enc[f])
            else:
                logits = out.logits[i, -1]
                vals.append(logits[self.logit_tokens[j]] - logits.mean())
        return torch.stack(vals).to(self.dtype)

    def __call__(self, chunk) -> tuple[Tensor, Tensor]:
        """(rows `[len(chunk) n_sources]`, target values `[len(chunk)]`)."""
        run = self.run
        alphas = alphas_like(run, batch=len(chunk))
        # features only: the blocks up to the last of their layers, no unembedding
        stop = None if any(kind == "logit" for kind, _ in chunk) else \
            1 + max(int(self.feats[j, 0]) for _, j in chunk)
        out = frozen_forward(self.model, run, alphas, detach_scores=True, stop_at_layer=stop)
        vals = self.values(out, chunk)
        grads = torch.autograd.grad(vals.sum(), alphas.tensors(), allow_unused=True)
        return _rows(grads, alphas, self.layers, run, self.model.cfg.n_layers,
                     run.n_pos), vals.detach()


def _full(rows: _RowMaker, batch: int, n_nodes: int, bar) -> tuple[Tensor, Tensor]:
    """Every active feature's row and the logit rows, in node order: the exact full graph."""
    n_f, n_logits = rows.feats.shape[0], len(rows.logit_tokens)
    adjacency = torch.zeros(n_nodes, n_nodes, dtype=rows.dtype)
    target_values = torch.zeros(n_nodes, dtype=rows.dtype)
    targets = [("feature", i) for i in range(n_f)] + [("logit", i) for i in range(n_logits)]
    index = list(range(n_f)) + [n_nodes - n_logits + i for i in range(n_logits)]
    for start in range(0, len(targets), batch):
        chunk = targets[start:start + batch]
        block, vals = rows(chunk)
        idx = index[start:start + len(chunk)]
        adjacency[idx, :n_nodes - n_logits] = block
        target_values[idx] = vals
        bar.update(len(chunk))
    return adjacency, target_values


def _budgeted(rows: _RowMaker, budget, batch: int, n_f: int, n_nodes: int, probs: Tensor,
              bar) -> tuple[Tensor, Tensor, Tensor, BudgetReport]:
    """The logit rows, then feature rows in batches of the features with the largest
    estimated influence not yet computed, the estimate refined as rows come in (each time
    the computed rows have grown by a quarter), until `n_f` features. Returns the adjacency
    over the chosen features (node order: by layer, position, feature, as the full graph),
    the target values, the chosen features' indices among the active ones and the report."""
    n_active, n_logits, dtype = rows.feats.shape[0], len(rows.logit_tokens), rows.dtype
    n_sources = n_nodes - n_logits - n_f + n_active
    computed = torch.empty(n_logits + n_f, n_sources, dtype=dtype)
    values = torch.empty(n_logits + n_f, dtype=dtype)
    logit_targets = [("logit", i) for i in range(n_logits)]
    for start in range(0, n_logits, batch):
        chunk = logit_targets[start:start + batch]
        computed[start:start + len(chunk)], values[start:start + len(chunk)] = rows(chunk)
        bar.update(len(chunk))
    sums = computed[:n_logits].abs().sum(1, dtype=torch.float64)
    weights = probs.to(torch.float64)
    depth = rows.model.cfg.n_layers + 1
    visited: list[int] = []
    done = torch.zeros(n_active, dtype=torch.bool)
    influence = partial_influence(computed, sums, n_logits, weights, torch.zeros(0, dtype=torch
                                  .long), n_active, depth)[:n_active]
    refresh = 0
    while len(visited) < n_f:
        if len(visited) >= refresh:
            if visited:
                influence = partial_influence(computed[:n_logits + len(visited)], sums,
                                              n_logits, weights, torch.tensor(visited),
                                              n_active, depth)[:n_active]
            refresh = max(len(visited) + 4 * batch, int(len(visited) * 1.25))
        ranked = influence.masked_fill(done, -1.0).argsort(descending=True, stable=True)
        take = ranked[:min(batch, n_f - len(visited))].tolist()
        block, vals = rows([("feature", j) for j in take])
        at = n_logits + len(visited)
        computed[at:at + len(take)], values[at:at + len(take)] = block, vals
        sums = torch.cat([sums, block.abs().sum(1, dtype=torch.float64)])
        visited += take
        done[take] = True
        bar.update(len(take))
    influence = partial_influence(computed, sums, n_logits, weights, torch.tensor(visited),
                                  n_active, depth)
    chosen = done.nonzero().flatten()                       # node order: by index
    row_of = torch.empty(n_active, dtype=torch.long)
    row_of[torch.tensor(visited)] = torch.arange(n_logits, n_logits + n_f)
    columns = torch.cat([chosen, torch.arange(n_active, n_sources)])
    left = (~done).nonzero().flatten()
    adjacency = torch.zeros(n_nodes, n_nodes, dtype=dtype)
    dropped = torch.zeros(n_nodes, dtype=dtype)
    target_values = torch.zeros(n_nodes, dtype=dtype)
    source_rows = torch.cat([row_of[chosen], torch.arange(n_logits)])
    node_rows = torch.cat([torch.arange(n_f), torch.arange(n_nodes - n_logits, n_nodes)])
    for s in range(0, len(source_rows), 256):
        src, dst = source_rows[s:s + 256], node_rows[s:s + 256]
        block = computed[src]
        adjacency[dst, :n_nodes - n_logits] = block[:, columns]
        dropped[dst] = block[:, left].sum(1)
        target_values[dst] = values[src]
    target = computed[0].abs()                              # the first logit: the target
    effect_left = float(target[left].sum() / target.sum().clamp(min=1e-30))
    del computed
    total = float(influence.sum())
    left_influence = influence[left]
    order = left_influence.argsort(descending=True, stable=True)
    report = BudgetReport(
        max_feature_nodes=budget.max_feature_nodes, memory_bytes=budget.memory_bytes,
        batch_size=batch, n_active=n_active, n_selected=n_f, left_out=rows.feats[left][order],
        left_out_influence=left_influence[order].to(dtype),
        influence_left_out=float(left_influence.sum()) / total if total > 0 else 0.0,
        target_effect_left_out=effect_left,
        dropped_effect=dropped)
    return adjacency, target_values, chosen, report


def _rows(grads, alphas, layers, run: CleanRun, n_layers: int, n_pos: int) -> Tensor:
    """Gradients by the alphas -> adjacency rows over [features, errors, embeddings]."""
    batch = alphas.embed.shape[0]
    g_embed, g_err, *g_feats = grads
    dtype = alphas.embed.dtype

    def dense(g, shape):
        return torch.zeros(shape, dtype=dtype) if g is None else g

    feats = [dense(g, (batch, len(run.features[layer][0])))
             for g, layer in zip(g_feats, layers, strict=True)]
    return torch.cat([*feats, dense(g_err, (batch, n_layers, n_pos)).reshape(batch, -1),
                      dense(g_embed, (batch, n_pos))], 1)


__all__ = ["AttributionGraph", "attribute", "choose_logits", "resolve_targets", "token_strings"]
