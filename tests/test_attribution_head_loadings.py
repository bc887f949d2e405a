"""Head loadings (attnlens.interp.attribution.head_loadings) on every variant, float64: per
layer, the per-head shares plus the independently computed bypass equal the graph's edge; a
head's share is the edge lost when that head alone is cut; MTA's and DCMHA's mixed patterns
split exactly over their source heads; the `attention` extension of the graph JSON carries them
and circuit-tracer's pydantic models (mirrored here) still validate the file and ignore it."""

import json

import pytest
import torch
from attribution_models import CASES, model_and_transcoders, prompt

from attnlens.interp.attribution.export import ATTENTION_KEY, graph_to_json, write_graph
from attnlens.interp.attribution.graph import attribute
from attnlens.interp.attribution.head_loadings import (
    head_loadings,
    pattern_parts,
    qk_for_top_heads,
    target_value,
)
from attnlens.interp.attribution.prune import prune
from attnlens.interp.attribution.replacement import (
    FrozenOutputs,
    alphas_like,
    clean_run,
    frozen_hooks,
)
from attnlens.interp.plots.attribution_graph import head_loadings_figure

TIGHT = dict(atol=1e-12, rtol=0)


def _edge_mask(graph):
    """Edges into the target logit and into the last position's features (a few hundred)."""
    mask = torch.zeros_like(graph.adjacency, dtype=torch.bool)
    mask[graph.logit_index(graph.target_logit)] = True
    last = (graph.features[:, 1] == graph.n_pos - 1).nonzero().flatten()
    mask[last] = True
    return mask


@pytest.fixture(scope="module", params=list(CASES))
def loaded(request):
    model, tcs = model_and_transcoders(request.param)
    graph = attribute(model, tcs, prompt(model), max_logits=2)
    run = clean_run(model, tcs, prompt(model))
    loads = head_loadings(model, tcs, graph, edge_mask=_edge_mask(graph), run=run)
    return request.param, model, tcs, graph, run, loads


def test_heads_plus_bypass_is_the_edge_at_every_layer(loaded):
    case, model, _, graph, _, loads = loaded
    n = len(loads.targets)
    assert n > 50 and loads.heads.shape == (n, model.cfg.n_layers, model.cfg.n_heads)
    edges = graph.adjacency[loads.targets, loads.sources]
    torch.testing.assert_close(loads.heads.sum(-1) + loads.bypass, edges[:, None].expand(
        -1, model.cfg.n_layers), **TIGHT)
    # the split says something: attention carries part of the edges, not all of them
    assert float(loads.heads.abs().sum()) > 0.1 * float(edges.abs().sum())
    assert float((loads.bypass - edges[:, None]).abs().max()) > 1e-3
    assert loads.source_heads == (case in ("mta", "dcmha"))


def test_layer0_and_later_sources(loaded):
    """A source written after a layer's attention cannot pass it: its bypass is the edge."""
    _, model, _, graph, _, loads = loaded
    kinds = [graph.node_kind(int(s)) for s in loads.sources]
    late = torch.tensor([k == "feature" and int(graph.features[int(s), 0]) >= 1
                         for k, s in zip(kinds, loads.sources, strict=True)])
    assert late.any()
    assert float(loads.heads[late][:, :2].abs().max()) == 0.0


def _edges_with_head_cut(model, run, graph, layer, head, targets):
    """Rows of the graph (d target / d alphas) with head `head` of layer `layer` cut from v."""
    alphas = alphas_like(run, len(targets))
    store: dict = {}
    hooks = frozen_hooks(model, run, alphas, store=store)

    def cut(act, hook):
        keep = torch.ones(act.shape[2], dtype=act.dtype)
        keep[head] = 0
        z = act * keep[:, None] + (act * (1 - keep)[:, None]).detach()
        store[("z", layer)] = z
        return z

    hooks.append((f"blocks.{layer}.attn.hook_z", cut))
    with model.hooks(fwd_hooks=hooks):
        logits = model(run.tokens.expand(len(targets), -1))
    out = FrozenOutputs(logits=logits, live={},
                        mlp_in={k: store[("mlp_in", k)] for k in run.transcoders})
    values = torch.stack([target_value(graph, run.transcoders, out, i, t)
                          for i, t in enumerate(targets)])
    grads = torch.autograd.grad(values.sum(), alphas.tensors(), allow_unused=True)
    g_embed, g_err, *g_feats = grads
    return torch.cat([*g_feats, g_err.flatten(1), g_embed], 1)


@pytest.mark.parametrize("layer,head", [(0, 1), (1, 2)])
def test_a_share_is_the_edge_lost_by_cutting_that_head(loaded, layer, head):
    case, model, _, graph, run, loads = loaded
    if loads.source_heads:
        pytest.skip("mixing variants split over source heads (next test)")
    target = graph.logit_index(graph.target_logit)
    rows = _edges_with_head_cut(model, run, graph, layer, head, [target])[0]
    pick = loads.targets == target
    sources = loads.sources[pick]
    lost = graph.adjacency[target, sources] - rows[sources]
    torch.testing.assert_close(loads.heads[pick][:, layer, head], lost, **TIGHT)


@pytest.mark.parametrize("case", ["mta", "dcmha"])
def test_mixed_patterns_split_over_source_heads(case):
    model, tcs = model_and_transcoders(case)
    run = clean_run(model, tcs, prompt(model))
    for layer in range(model.cfg.n_layers):
        parts, mixed = pattern_parts(model, run, layer)
        assert mixed
        torch.testing.assert_close(parts.sum(0), run.cache[f"blocks.{layer}.attn.hook_pattern"][0],
                                   **TIGHT)
        off = parts * (1 - torch.eye(parts.shape[0], dtype=parts.dtype))[:, :, None, None]
        assert float(off.abs().max()) > 1e-4          # the mixing really draws across heads


# circuit-tracer's pydantic models (circuit_tracer/frontend/graph_models.py, commit 196e2ce),
# declared here field for field since circuit-tracer is not installed in the test environment
def _circuit_tracer_model():
    pydantic = pytest.importorskip("pydantic")

    class Metadata(pydantic.BaseModel):
        slug: str
        scan: str
        transcoder_list: list[str]
        prompt_tokens: list[str]
        prompt: str
        node_threshold: float | None = None
        schema_version: int | None = 1

    class QParams(pydantic.BaseModel):
        pinnedIds: list[str]
        supernodes: list[list[str]]
        linkType: str
        clickedId: str
        sg_pos: str

    class Node(pydantic.BaseModel):
        node_id: str
        feature: int
        layer: str
        ctx_idx: int
        feature_type: str
        token_prob: float = 0.0
        is_target_logit: bool = False
        run_idx: int = 0
        reverse_ctx_idx: int = 0
        jsNodeId: str
        clerp: str = ""
        influence: float | None = None
        activation: float | None = None

    class Model(pydantic.BaseModel):
        metadata: Metadata
        qParams: QParams
        nodes: list[Node]
        links: list[dict]

    return Model


def test_the_extension_travels_in_the_json_and_validates(loaded, tmp_path):
    case, model, tcs, graph, run, loads = loaded
    if case not in ("mha-rotary", "dcmha"):
        pytest.skip("the file format is the same for every variant")
    pruned = prune(graph, 0.9, 0.99)
    qks = qk_for_top_heads(model, tcs, graph, loads, n=1, run=run)
    assert len(qks) == 1
    path = write_graph(graph, tmp_path, "heads", node_mask=pruned.node_mask,
                       edge_mask=pruned.edge_mask, head_loadings=loads, qk=qks)
    data = json.loads(path.read_text())
    ext = data[ATTENTION_KEY]
    assert ext["head_kind"] == ("source head" if case == "dcmha" else "head")
    links = {(link["source"], link["target"]): link["weight"] for link in data["links"]}
    assert ext["loadings"] and all((r["source"], r["target"]) in links for r in ext["loadings"])
    for record in ext["loadings"]:
        weight = links[(record["source"], record["target"])]
        for heads, bypass in zip(record["heads"], record["bypass"], strict=True):
            assert sum(heads) + bypass == pytest.approx(weight, abs=1e-12)
    (qk,) = ext["qk"]
    assert {"layer", "head", "query_pos", "key_pos", "score", "query", "key"} <= set(qk)
    parsed = _circuit_tracer_model().model_validate(data)
    assert ATTENTION_KEY not in parsed.model_dump()
    plain = graph_to_json(graph, "heads", pruned.node_mask, pruned.edge_mask)
    assert ATTENTION_KEY not in plain and {k: v for k, v in data.items()
                                           if k != ATTENTION_KEY} == plain
    fig = head_loadings_figure(loads)
    (heat,) = fig.data
    assert torch.tensor(heat.z).shape == (model.cfg.n_layers, model.cfg.n_heads)
    torch.testing.assert_close(torch.tensor(heat.z, dtype=torch.float64),
                               loads.heads.abs().sum(0), **TIGHT)


def test_bad_requests_are_named():
    model, tcs = model_and_transcoders("mha-rotary")
    graph = attribute(model, tcs, prompt(model), max_logits=1)
    with pytest.raises(ValueError, match="edge_mask must be"):
        head_loadings(model, tcs, graph, edge_mask=torch.ones(3, 3, dtype=torch.bool))
    other, other_tcs = model_and_transcoders("cope")
    with pytest.raises(ValueError, match="not this model's"):
        head_loadings(other, other_tcs, graph, edge_mask=torch.zeros_like(graph.adjacency,
                                                                          dtype=torch.bool))
