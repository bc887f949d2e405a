"""Attribution graphs on every variant (attnlens.interp.attribution): the replacement model
reproduces the model exactly, it is affine in its sources, edges equal exact ablations and finite
differences, rows sum to their targets, and pruning follows influence. float64 throughout."""

import pytest
import torch
from attribution_models import CASES, model_and_transcoders, prompt

from attnlens.interp.attribution.graph import attribute
from attnlens.interp.attribution.prune import coverage_cutoff, normalized, path_influence, prune
from attnlens.interp.attribution.replacement import alphas_like, clean_run, frozen_forward
from attnlens.interp.sae.transcoder import mlp_hooks

from helpers import tiny_model

TIGHT = dict(atol=1e-12, rtol=0)


@pytest.mark.parametrize("case", list(CASES))
def test_replacement_model_equals_the_model_with_error_nodes(case):
    model, tcs = model_and_transcoders(case)
    run = clean_run(model, tcs, prompt(model))
    out = frozen_forward(model, run, alphas_like(run, batch=2))
    torch.testing.assert_close(out.logits, run.logits.expand(2, -1, -1), **TIGHT)
    for layer, tc in tcs.items():
        x = run.cache[mlp_hooks(layer)[0]]
        torch.testing.assert_close(out.mlp_in[layer], x.expand(2, -1, -1), **TIGHT)
        # reconstruction + error is the MLP's output
        f = tc.activate(tc.pre_acts(x[0]))
        torch.testing.assert_close(f @ tc.W_dec + tc.b_dec + run.errors[layer],
                                   run.cache[mlp_hooks(layer)[1]][0], **TIGHT)
    if case.startswith("infini"):   # the memory is in play: pattern mass beyond the segment
        pattern = run.cache["blocks.1.attn.hook_pattern"][0]
        assert pattern[:, 8:, :4].abs().sum() > 1e-3


@pytest.mark.parametrize("case", list(CASES))
def test_replacement_model_is_affine_in_its_sources(case):
    """logits(a) - logits(0) is linear in the source scales a."""
    model, tcs = model_and_transcoders(case)
    run = clean_run(model, tcs, prompt(model))
    g = torch.Generator().manual_seed(0)

    def logits(alphas_fn):
        a = alphas_like(run, 1, 0.0, False)
        for t in a.tensors():
            t.copy_(alphas_fn(t))
        with torch.no_grad():
            return frozen_forward(model, run, a).logits

    r1 = [torch.randn(t.shape, generator=g, dtype=t.dtype) for t in alphas_like(run).tensors()]
    r2 = [torch.randn(t.shape, generator=g, dtype=t.dtype) for t in r1]
    it1, it2, it3 = iter(r1), iter(r2), iter(zip(r1, r2, strict=True))
    base = logits(torch.zeros_like)
    l1, l2 = logits(lambda t: next(it1)), logits(lambda t: next(it2))
    l12 = logits(lambda t: sum(next(it3)))
    torch.testing.assert_close(l12 - base, (l1 - base) + (l2 - base), atol=1e-11, rtol=0)


@pytest.fixture(scope="module", params=list(CASES))
def graph_case(request):
    model, tcs = model_and_transcoders(request.param)
    graph = attribute(model, tcs, prompt(model), batch_size=16)
    return request.param, model, tcs, graph


def test_rows_sum_to_their_targets(graph_case):
    case, model, tcs, graph = graph_case
    rows = list(range(graph.n_features)) + [graph.logit_index(i) for i in range(graph.n_logits)]
    totals = graph.adjacency[rows].sum(1) + graph.bias[rows]
    torch.testing.assert_close(totals, graph.target_values[rows], atol=1e-11, rtol=0)
    # the targets are the clean model's values: feature pre-activations, demeaned logits
    run = clean_run(model, tcs, prompt(model))
    for i in range(graph.n_features):
        layer, pos, f = graph.features[i].tolist()
        tc = tcs[layer]
        pre = run.cache[mlp_hooks(layer)[0]][0, pos] @ tc.W_enc[:, f] + tc.b_enc[f]
        assert abs(float(pre) - float(graph.target_values[i])) < 1e-12
    last = run.logits[0, -1]
    demeaned = last[graph.logit_tokens] - last.mean()
    torch.testing.assert_close(graph.target_values[rows[graph.n_features:]], demeaned, **TIGHT)
    # causality: no edge from a later position, none into errors/embeddings, none from logits
    for i in range(graph.n_features):
        layer, pos, _ = graph.features[i].tolist()
        for j in graph.adjacency[i].nonzero().flatten().tolist():
            kind = graph.node_kind(j)
            if kind == "feature":
                assert graph.features[j, 0] < layer and graph.features[j, 1] <= pos
            elif kind == "error":
                src_layer, src_pos = divmod(j - graph.n_features, graph.n_pos)
                assert src_layer < layer and src_pos <= pos
    assert not graph.adjacency[graph.n_features:graph.n_nodes - graph.n_logits].any()
    assert not graph.adjacency[:, graph.n_nodes - graph.n_logits:].any()
    assert 0 <= graph.error_share() <= 1


def _alphas_for(graph, run, node: int, value: float):
    """Scales with source `node` (graph order) set to `value`, the rest 1."""
    a = alphas_like(run, 1, 1.0, False)
    if node < graph.n_features:
        layer, pos, f = graph.features[node].tolist()
        positions, feats, _ = run.features[layer]
        index = ((positions == pos) & (feats == f)).nonzero()[0, 0]
        a.features[layer][0, index] = value
    elif node < graph.n_features + graph.n_errors:
        layer, pos = divmod(node - graph.n_features, graph.n_pos)
        a.errors[0, layer, pos] = value
    else:
        a.embed[0, node - graph.n_features - graph.n_errors] = value
    return a


def _target(graph, tcs, out, row: int) -> float:
    if row < graph.n_features:
        layer, pos, f = graph.features[row].tolist()
        return float(out.mlp_in[layer][0, pos] @ tcs[layer].W_enc[:, f] + tcs[layer].b_enc[f])
    logits = out.logits[0, -1]
    token = graph.logit_tokens[row - (graph.n_nodes - graph.n_logits)]
    return float(logits[token] - logits.mean())


def test_edges_equal_ablations_and_finite_differences(graph_case):
    """Each sampled edge = target(source kept) - target(source ablated), and the central
    difference of the target in the source's scale (exact: the model is affine in it)."""
    case, model, tcs, graph = graph_case
    run = clean_run(model, tcs, prompt(model))
    nonzero = graph.adjacency.nonzero()
    g = torch.Generator().manual_seed(0)
    picks = nonzero[torch.randperm(len(nonzero), generator=g)[:6]].tolist()
    picks.append([graph.logit_index(0), int(graph.adjacency[graph.logit_index(0)].abs().argmax())])
    for row, source in picks:
        with torch.no_grad():
            full = _target(graph, tcs, frozen_forward(model, run, _alphas_for(graph, run, source,
                                                                              1.0)), row)
            ablated = _target(graph, tcs, frozen_forward(model, run,
                                                         _alphas_for(graph, run, source, 0.0)), row)
            eps = 1e-3
            up = _target(graph, tcs, frozen_forward(model, run,
                                                    _alphas_for(graph, run, source, 1 + eps)), row)
            down = _target(graph, tcs, frozen_forward(model, run,
                                                      _alphas_for(graph, run, source, 1 - eps)),
                           row)
        edge = float(graph.adjacency[row, source])
        assert abs((full - ablated) - edge) < 1e-11, (case, row, source)
        assert abs((up - down) / (2 * eps) - edge) < 1e-8, (case, row, source)


def test_batching_does_not_change_the_graph():
    model, tcs = model_and_transcoders("dcmha")
    a = attribute(model, tcs, prompt(model), batch_size=1, max_logits=3)
    b = attribute(model, tcs, prompt(model), batch_size=7, max_logits=3)
    torch.testing.assert_close(a.adjacency, b.adjacency, atol=1e-13, rtol=0)


def test_targets_and_errors():
    model, tcs = model_and_transcoders("mha-rotary")
    g = attribute(model, tcs, prompt(model), targets=[7, 9])
    assert g.logit_tokens.tolist() == [7, 9] and g.n_logits == 2
    with pytest.raises(ValueError, match="outside the vocabulary"):
        attribute(model, tcs, prompt(model), targets=[10_000])
    with pytest.raises(ValueError, match=r"layers \[1\] have none"):
        attribute(model, {0: tcs[0]}, prompt(model))
    with pytest.raises(ValueError, match="one prompt at a time"):
        attribute(model, tcs, prompt(model).expand(2, -1))
    with pytest.raises(ValueError, match="attention-only"):
        attribute(tiny_model(attn_only=True), tcs, prompt(model))
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        attribute(model, tcs, prompt(model), batch_size=0)


def test_path_influence_by_hand():
    # chain 0 -> 1 -> 2 (logit), plus 0 -> 2 directly; A[target, source]
    a = torch.zeros(3, 3, dtype=torch.float64)
    a[1, 0], a[2, 1], a[2, 0] = 2.0, -1.0, 1.0
    n = normalized(a)
    torch.testing.assert_close(n[2], torch.tensor([0.5, 0.5, 0], dtype=torch.float64))
    w = torch.tensor([0, 0, 1.0], dtype=torch.float64)
    # node 1: 0.5 directly; node 0: 0.5 directly + 0.5 * 1 through node 1
    torch.testing.assert_close(path_influence(n, w), torch.tensor([1.0, 0.5, 0],
                                                                   dtype=torch.float64))
    inverse = torch.linalg.inv(torch.eye(3, dtype=torch.float64) - n) - torch.eye(3)
    torch.testing.assert_close(path_influence(n, w), w @ inverse)
    cycle = torch.tensor([[0, 1.0], [1.0, 0]], dtype=torch.float64)
    with pytest.raises(ValueError, match="cycle"):
        path_influence(cycle, torch.tensor([1.0, 0], dtype=torch.float64))
    assert coverage_cutoff(torch.tensor([5.0, 3, 2]), 0.5) == 5.0
    assert coverage_cutoff(torch.tensor([5.0, 3, 2]), 0.8) == 3.0


def test_pruning_keeps_what_reaches_the_logits(graph_case):
    case, model, tcs, graph = graph_case
    everything = prune(graph, node_threshold=1.0, edge_threshold=1.0)
    influential = everything.node_influence[:graph.n_features] > 0
    assert not (everything.node_mask[:graph.n_features] & ~influential).any()
    pruned = prune(graph, node_threshold=0.5, edge_threshold=0.9)
    assert pruned.node_mask.sum() <= everything.node_mask.sum()
    first_embedding = graph.n_features + graph.n_errors
    assert pruned.node_mask[first_embedding:].all()      # embeddings and logits stay
    kept_edges = pruned.edge_mask.nonzero()
    assert pruned.node_mask[kept_edges[:, 0]].all() and pruned.node_mask[kept_edges[:, 1]].all()
    assert (graph.adjacency[pruned.edge_mask] != 0).all()
    # every kept feature has an edge out and an edge in; every kept error node an edge out
    feats = pruned.node_mask[:graph.n_features].nonzero().flatten()
    assert pruned.edge_mask[:, feats].any(0).all() and pruned.edge_mask[feats].any(1).all()
    errors = graph.n_features + pruned.node_mask[graph.n_features:first_embedding].nonzero()
    assert pruned.edge_mask[:, errors.flatten()].any(0).all()
    with pytest.raises(ValueError, match="node_threshold must be in"):
        prune(graph, node_threshold=0)
