"""Why a head attended where it did: the QK side of an attribution graph, for every variant.

An attribution graph freezes attention patterns, so it says what flowed through a head, not why
the head looked there. Here the head's pre-softmax score at (query, key) is attributed to the
graph's sources (features, error nodes, embeddings) through the query and through the key.

In the replacement model (`attnlens.interp.attribution.replacement`) the queries and keys of a layer
are affine in the sources, and each variant's pre-softmax score is *bilinear* in them: one affine
function of the queries times one of the keys (`score_stage`):

- MHA and Infini's local attention: `q . k / sqrt(d)` (`hook_attn_scores`);
- MTA: the key-query convolution and pre-softmax head mixing are linear maps of the q . k map, so
  the mixed logits (`hook_pre_sm_mix`, else `hook_pre_sm_conv`) are a weighted sum of q . k
  products over the kernel's window and the mixed heads;
- DCMHA: Compose's pre-softmax cross-head terms mix the heads' q . k maps with the prompt's
  dynamic weights (frozen), so `hook_composed_scores` is a weighted sum over heads;
- CoPE: content `q . k` plus the position logit `q . e[p]`, with the contextual positions `p`
  frozen: the position term runs through the query only (`cope_position_counts` gives what
  each token's gate added to the position).

To keep the two sides apart, the replacement model runs two copies: the queries of copy 0 see
source scales `alpha_q`, the keys (crossed in from copy 1) see `alpha_k`. Then, exactly,

    query_side[s] = d score / d alpha_q[s]  = score - score(source s removed from the query)
    key_side[s]   = d score / d alpha_k[s]  = score - score(source s removed from the key)

and `sum(query_side) + query_bias == score == sum(key_side) + key_bias`, the biases being the
score with every source removed from that side. `pairs` gives the bilinear terms between the
largest sources of each side (`d^2 score / d alpha_q[s] d alpha_k[t]`).

After the softmax, MTA's post-softmax convolution and head mixing and DCMHA's post-softmax
Compose are linear in the softmax maps: `pattern_sources` splits an effective pattern entry
exactly into the (head, query, key) softmax entries it mixes.

Example:
    >>> qk = attribute_qk(model, transcoders, "a b a", layer=1, head=0,
    ...                   query_pos=2, key_pos=1)                          # doctest: +SKIP
    >>> qk.top("query", 5)                                                  # doctest: +SKIP
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import torch
from torch import Tensor

from attnlens.interp.attribution.replacement import (
    Alphas,
    CleanRun,
    alphas_like,
    clean_run,
    frozen_hooks,
    prompt_tokens,
)
from attnlens.interp.sae.transcoder import Transcoder

PRE_SOFTMAX_INPUTS = {"mta": "hook_softmax", "dcmha": "hook_probs"}


def score_stage(model, layer: int) -> str:
    """The hook holding the variant's final pre-softmax score map at `layer`: the last map of
    its stage catalogue before the softmax (MHA and Infini `hook_attn_scores`, MTA
    `hook_pre_sm_mix`, CoPE `hook_attn_logits`, DCMHA `hook_composed_scores`)."""
    pre = [s for s in model.stages(layer) if s.is_map and s.softmax == "pre"]
    if not pre:
        raise ValueError(f"layer {layer} of this {model.cfg.attention} model has no "
                         "pre-softmax map stage")
    return f"blocks.{layer}.attn.{pre[-1].hook_name}"


def check_entry(model, n_pos: int, layer: int, head: int, query_pos: int, key_pos: int) -> None:
    """ValueError unless (layer, head, query_pos, key_pos) names an entry of a map of this model
    on `n_pos` tokens: ints (not bool) in range, no negative index counted from the end, and the
    key at or before the query (every attnlens model is causal)."""
    for name, value, top in (("layer", layer, model.cfg.n_layers),
                             ("head", head, model.cfg.n_heads), ("query_pos", query_pos, n_pos),
                             ("key_pos", key_pos, n_pos)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise ValueError(f"{name} must be an int, got {value!r}")
        if not 0 <= value < top:
            raise ValueError(f"{name}={value} is out of range (0 .. {top - 1})")
    if key_pos > query_pos:
        raise ValueError(f"key_pos {key_pos} is after query_pos {query_pos}: a causal head "
                         "cannot attend there")


def key_hook(model, layer: int) -> str:
    prefix = f"blocks.{layer}.attn."
    return prefix + ("hook_rot_k" if prefix + "hook_rot_k" in model.hook_dict else "hook_k")


@dataclass
class QKAttribution:
    """A head's score at (query_pos, key_pos) split over sources, through query and key.

    `query_side`, `key_side`: `[n_sources]` in graph order (features of `feature_rows`, then
    error nodes layer-major, then embeddings); `labels` names them.
    """

    layer: int
    head: int
    query_pos: int
    key_pos: int
    stage: str
    score: float
    query_side: Tensor
    key_side: Tensor
    query_bias: float
    key_bias: float
    labels: list[str]
    features: Tensor

    def top(self, side: str = "query", n: int = 10) -> list[tuple[str, float]]:
        values = {"query": self.query_side, "key": self.key_side}[side]
        order = values.abs().argsort(descending=True)[:n]
        return [(self.labels[i], float(values[i])) for i in order]


def _stack(a: Alphas, b: Alphas) -> Alphas:
    return Alphas(embed=torch.cat([a.embed, b.embed]), errors=torch.cat([a.errors, b.errors]),
                  features={k: torch.cat([a.features[k], b.features[k]]) for k in a.features})


def _cross_keys(act, hook):
    """Copy 0's keys become copy 1's (so copy 0's scores pair alpha_q queries with alpha_k keys)."""
    return torch.stack([act[1], act[1]])


def qk_score(model, run: CleanRun, alphas_q: Alphas, alphas_k: Alphas, layer: int, head: int,
             query_pos: int, key_pos: int, stage: str | None = None, extra_hooks=()) -> Tensor:
    """The score at (head, query_pos, key_pos) of `layer` with queries under `alphas_q` and keys
    under `alphas_k` (differentiable in both). `extra_hooks` edit the replacement model further
    (they run after its own, e.g. zeroing a head's `hook_z` to take a path out)."""
    stage = stage or score_stage(model, layer)
    alphas = _stack(alphas_q, alphas_k)
    store: dict = {}
    hooks = frozen_hooks(model, run, alphas, read=(stage,), store=store)
    hooks.append((key_hook(model, layer), _cross_keys))
    hooks += list(extra_hooks)
    with model.hooks(fwd_hooks=hooks):
        model(run.tokens.expand(2, -1), stop_at_layer=layer + 1)
    return store[stage][0, head, query_pos, key_pos]


def source_labels(model, run: CleanRun) -> tuple[list[str], Tensor]:
    from attnlens.interp.attribution.graph import token_strings

    tokens = token_strings(model, run.tokens[0])
    labels, feats = [], []
    for layer in sorted(run.features):
        pos, feat, _ = run.features[layer]
        for p, f in zip(pos.tolist(), feat.tolist(), strict=True):
            labels.append(f"L{layer} F{f} @{p} {tokens[p]!r}")
            feats.append((layer, p, f))
    labels += [f"L{layer} error @{p} {tokens[p]!r}" for layer in range(len(run.errors))
               for p in range(run.n_pos)]
    labels += [f"embed @{p} {tokens[p]!r}" for p in range(run.n_pos)]
    return labels, torch.tensor(feats, dtype=torch.long).reshape(-1, 3)


def _flat(grads, alphas: Alphas, run: CleanRun) -> Tensor:
    g_embed, g_err, *g_feats = grads
    parts = []
    for g, layer in zip(g_feats, sorted(run.features), strict=True):
        parts.append(torch.zeros_like(alphas.features[layer][0]) if g is None else g[0])
    parts.append((torch.zeros_like(alphas.errors[0]) if g_err is None else g_err[0]).flatten())
    parts.append(torch.zeros_like(alphas.embed[0]) if g_embed is None else g_embed[0])
    return torch.cat(parts)


def attribute_qk(model, transcoders: dict[int, Transcoder], prompt, layer: int, head: int,
                 query_pos: int, key_pos: int, run: CleanRun | None = None,
                 extra_hooks=()) -> QKAttribution:
    """Attribute `layer`/`head`'s pre-softmax score at (query_pos, key_pos) (module doc);
    `extra_hooks` as in `qk_score`."""
    run = run or clean_run(model, transcoders, prompt)
    check_entry(model, run.n_pos, layer, head, query_pos, key_pos)
    stage = score_stage(model, layer)
    aq, ak = alphas_like(run), alphas_like(run)
    score = qk_score(model, run, aq, ak, layer, head, query_pos, key_pos, stage, extra_hooks)
    if not torch.isfinite(score):
        note = (" (Infini: a key outside the query's segment is read through the compressive "
                "memory, which has no per-key score)" if model.cfg.attention == "infini" else "")
        raise ValueError(f"the score at ({query_pos}, {key_pos}) of layer {layer} head {head} is "
                         f"{score.item()}: that key is masked for that query{note}")
    grads = torch.autograd.grad(score, aq.tensors() + ak.tensors(), allow_unused=True)
    k = len(aq.tensors())
    q_side, k_side = _flat(grads[:k], aq, run), _flat(grads[k:], ak, run)
    with torch.no_grad():
        zeros, ones = alphas_like(run, 1, 0.0, False), alphas_like(run, 1, 1.0, False)
        no_q = qk_score(model, run, zeros, ones, layer, head, query_pos, key_pos, stage,
                        extra_hooks)
        no_k = qk_score(model, run, ones, zeros, layer, head, query_pos, key_pos, stage,
                        extra_hooks)
    labels, feats = source_labels(model, run)
    return QKAttribution(layer=layer, head=head, query_pos=query_pos, key_pos=key_pos,
                         stage=stage, score=score.item(), query_side=q_side.detach(),
                         key_side=k_side.detach(), query_bias=float(no_q), key_bias=float(no_k),
                         labels=labels, features=feats)


# additive position terms of a variant's score, read at their own hook (CoPE's q . e[p])
POSITION_TERMS = {"cope": "hook_pos_logits"}


@dataclass
class QKSplit:
    """A head's score at (query_pos, key_pos) split into constant, positional and source terms.

    With the query-side scales `a` and key-side scales `b` (module doc) the score is
    `c0 + sum_s A[s] a_s + sum_t B[t] b_t + sum_st M[s, t] a_s b_t`: `c0` pairs the constant
    parts of q and k (b_Q . b_K and every other constant: biases, norm offsets, `b_dec`),
    `A[s]` source s's query against the constant key (q_s . b_K), `B[t]` the constant query
    against source t's key (b_Q . k_t), `M` source against source. `terms` holds c0, sum A,
    sum B and sum M (CoPE: the position logit q . e[p], linear in q, taken out of c0 and
    sum A as its own two terms), so `sum(terms) == score` exactly. `query[s] = sum_t M[s, t]`
    and `key[t] = sum_s M[s, t]` list the sources that can reach the head (embeddings; features
    and error nodes of earlier layers) and are non-zero; each list sums to sum M. Learned
    absolute position embeddings stay in their embedding source (as in the graph); rotary
    positions rotate q and k and add no term of their own.
    """

    layer: int
    head: int
    query_pos: int
    key_pos: int
    score: float
    terms: list[tuple[str, float]]
    query: list[tuple[str, float]]
    key: list[tuple[str, float]]


def _reaches(run: CleanRun, layer: int) -> Tensor:
    """`[n_sources]` bool: the source can reach layer `layer`'s attention (graph order)."""
    flags = []
    for src_layer in sorted(run.features):
        flags += [src_layer < layer] * len(run.features[src_layer][0])
    flags += [src_layer < layer for src_layer in range(len(run.errors)) for _ in range(run.n_pos)]
    flags += [True] * run.n_pos
    return torch.tensor(flags)


def qk_split(model, transcoders: dict[int, Transcoder], prompt, layer: int, head: int,
             query_pos: int, key_pos: int, run: CleanRun | None = None) -> QKSplit:
    """The split of `QKSplit` (its doc), from four replacement forwards and their gradients."""
    run = run or clean_run(model, transcoders, prompt)
    check_entry(model, run.n_pos, layer, head, query_pos, key_pos)
    stage = score_stage(model, layer)
    pos_hook = POSITION_TERMS.get(model.cfg.attention)

    def forward(aq, ak):
        store = {}
        extra = [] if pos_hook is None else [(f"blocks.{layer}.attn.{pos_hook}",
                                              lambda act, hook: store.setdefault("p", act))]
        score = qk_score(model, run, aq, ak, layer, head, query_pos, key_pos, stage, extra)
        pos = store["p"][0, head, query_pos, key_pos] if "p" in store else \
            torch.zeros((), dtype=score.dtype)
        return score, pos

    def side_grads(value, alphas):
        if not value.requires_grad:
            return torch.zeros(_reaches(run, layer).shape, dtype=value.dtype)
        return _flat(torch.autograd.grad(value, alphas.tensors(), allow_unused=True,
                                         retain_graph=True), alphas, run).detach()

    ones, zeros = alphas_like(run), alphas_like(run, 1, 0.0, False)
    aq, ak = alphas_like(run), alphas_like(run)
    score, _ = forward(aq, ak)
    if not torch.isfinite(score):
        raise ValueError(f"the score at ({query_pos}, {key_pos}) of layer {layer} head {head} is "
                         f"{score.item()}: that key is masked for that query")
    query_side, key_side = side_grads(score, aq), side_grads(score, ak)
    score_b, _ = forward(zeros, ones)                    # constant query
    b = side_grads(score_b, ones)
    aq1 = alphas_like(run)
    score_a, pos_a = forward(aq1, alphas_like(run, 1, 0.0, False))     # constant key
    a, p = side_grads(score_a, aq1), side_grads(pos_a, aq1)
    with torch.no_grad():
        c0, p0 = forward(alphas_like(run, 1, 0.0, False), alphas_like(run, 1, 0.0, False))
    m_query, m_key = query_side - a, key_side - b
    terms = [("constant q · constant k", float(c0 - p0)),
             ("q of sources · constant k", float(a.sum() - p.sum())),
             ("constant q · k of sources", float(b.sum())),
             ("q of sources · k of sources", float(m_query.sum()))]
    if pos_hook is not None:
        terms += [("position logit, constant q", float(p0)),
                  ("position logit, q of sources", float(p.sum()))]
    labels, _ = source_labels(model, run)
    reach = _reaches(run, layer)

    def listed(values):
        order = values.abs().argsort(descending=True).tolist()
        return [(labels[i], float(values[i])) for i in order
                if bool(reach[i]) and float(values[i]) != 0.0]

    return QKSplit(layer=layer, head=head, query_pos=query_pos, key_pos=key_pos,
                   score=float(score.detach()), terms=terms, query=listed(m_query),
                   key=listed(m_key))


def qk_pairs(model, run: CleanRun, layer: int, head: int, query_pos: int, key_pos: int,
             query_sources, key_sources) -> Tensor:
    """`[len(query_sources) len(key_sources)]` bilinear terms d^2 score / d alpha_q d alpha_k
    between chosen sources (indices in graph order)."""
    aq, ak = alphas_like(run), alphas_like(run)
    score = qk_score(model, run, aq, ak, layer, head, query_pos, key_pos)
    grads = torch.autograd.grad(score, aq.tensors(), create_graph=True, allow_unused=True)
    q_side = _flat(grads, aq, run)
    rows = []
    for s in query_sources:
        if not q_side.requires_grad:
            rows.append(torch.zeros(len(key_sources), dtype=q_side.dtype))
            continue
        g = torch.autograd.grad(q_side[int(s)], ak.tensors(), retain_graph=True,
                                allow_unused=True)
        rows.append(_flat(g, ak, run)[torch.as_tensor(key_sources, dtype=torch.long)])
    return torch.stack(rows).detach()


@dataclass
class PatternSources:
    """An effective pattern entry split over the softmax entries that a variant's post-softmax
    mixing combines: `entries` `[n 3]` (head, query, key), `contributions` `[n]`."""

    value: float
    entries: Tensor
    contributions: Tensor
    stage: str


def pattern_sources(model, prompt, layer: int, head: int, query_pos: int, key_pos: int,
                    min_share: float = 0.0, phase: str = "post") -> PatternSources:
    """Split a mixed map's entry over the entries it mixes, exactly (the map is linear in them
    when the dynamic weights are held fixed). phase "post": `hook_pattern[head, q, k]` over the
    softmax entries (MTA's post-softmax convolution and head mixing, DCMHA's post-softmax
    Compose); "pre": the final pre-softmax score (`score_stage`) over the raw `q . k` scores
    `hook_attn_scores` (MTA's key-query convolution and pre-softmax mixing, DCMHA's
    pre-softmax Compose)."""
    if phase not in ("pre", "post"):
        raise ValueError(f"phase must be 'pre' or 'post', got {phase!r}")
    name = PRE_SOFTMAX_INPUTS.get(model.cfg.attention)
    if name is None:
        raise ValueError(f"{model.cfg.attention} attention does not mix its softmax maps: its "
                         "effective pattern is its softmax itself")
    tokens = prompt_tokens(model, prompt)
    check_entry(model, tokens.shape[1], layer, head, query_pos, key_pos)
    prefix = f"blocks.{layer}.attn."
    target = prefix + "hook_pattern"
    if phase == "pre":
        name, target = "hook_attn_scores", score_stage(model, layer)
    store = {}

    def leaf(act, hook):
        store["probs"] = act.detach().requires_grad_()
        return store["probs"]

    def keep(act, hook):
        store["pattern"] = act

    dyn = [prefix + h for h in (f"hook_{phase}_{s}{w}" for s in "qk" for w in ("w1", "w2", "dd"))
           if prefix + h in model.hook_dict]
    freeze = [(h, lambda act, hook: act.detach()) for h in dyn]
    with model.hooks(fwd_hooks=freeze + [(prefix + name, leaf), (target, keep)]):
        model(tokens, stop_at_layer=layer + 1)
    value = store["pattern"][0, head, query_pos, key_pos]
    (grad,) = torch.autograd.grad(value, store["probs"])
    inputs = store["probs"].detach()
    finite = torch.isfinite(inputs)   # masked scores (-inf) take no part
    contrib = torch.where(finite, grad * torch.where(finite, inputs, 0), 0)[0]
    entries = contrib.nonzero()
    values = contrib[tuple(entries.T)]
    keep_mask = values.abs() >= min_share * values.abs().sum()
    order = values[keep_mask].abs().argsort(descending=True)
    return PatternSources(value=value.item(), entries=entries[keep_mask][order],
                          contributions=values[keep_mask][order].detach(),
                          stage=f"{target} <- {prefix + name}")


@dataclass
class PositionCounts:
    """CoPE's contextual position of key `key_pos` for `query_pos`, split over the tokens
    counted: `position = min(sum(gates), npos_max - 1)`, one gate per token from key to query
    (`clamped` says whether the cap applies, and then the split is of the uncapped sum)."""

    position: float
    tokens: list[int]
    gates: Tensor
    clamped: bool


@torch.no_grad()
def cope_position_counts(model, prompt, layer: int, head: int, query_pos: int,
                         key_pos: int) -> PositionCounts:
    """What each token between `key_pos` and `query_pos` added to CoPE's position p[q, k]
    (p[q, k] = sum over t from k to q of sigmoid(q_q . k_t), capped at npos_max - 1)."""
    if model.cfg.attention != "cope":
        raise ValueError(f"{model.cfg.attention} attention has no contextual positions")
    tokens = prompt_tokens(model, prompt)
    check_entry(model, tokens.shape[1], layer, head, query_pos, key_pos)
    prefix = f"blocks.{layer}.attn."
    _, cache = model.run_with_cache(tokens, names_filter=[prefix + "hook_gates",
                                                          prefix + "hook_positions"],
                                    stop_at_layer=layer + 1)
    gates = cache[prefix + "hook_gates"][0, head, query_pos, key_pos:query_pos + 1]
    position = float(cache[prefix + "hook_positions"][0, head, query_pos, key_pos])
    total = float(gates.sum())
    # the layer sums the gates in its own order (a reversed cumulative sum), so in float32 the
    # two sums differ by rounding: n terms in (0, 1) each round by at most eps * the running
    # sum. Only a gap beyond that, at the cap npos_max - 1, is the clamp.
    tol = 2 * gates.numel() * torch.finfo(gates.dtype).eps * max(abs(total), 1.0)
    cap = getattr(model.blocks[layer].attn, "npos_max", None)
    at_cap = cap is None or position >= cap - 1 - tol
    return PositionCounts(position=position, tokens=list(range(key_pos, query_pos + 1)),
                          gates=gates.clone(), clamped=bool(at_cap and total > position + tol))


__all__ = ["POSITION_TERMS", "PatternSources", "PositionCounts", "QKAttribution", "QKSplit",
           "attribute_qk", "check_entry",
           "cope_position_counts", "pattern_sources", "qk_pairs", "qk_score", "score_stage",
           "qk_split", "source_labels"]
