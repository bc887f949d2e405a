"""Graph JSON for circuit-tracer's local server and Neuronpedia's viewer
(interp.attribution.export). The expected fields and types are those of circuit-tracer's
pydantic models (circuit_tracer/frontend/graph_models.py: Metadata, QParams, Node, Link, Model;
checked at commit 196e2ce); a graph written here was also validated by those models by hand
(docs/attribution.md, "Viewing graphs")."""

import json

import pytest
import torch
from attribution_models import model_and_transcoders, prompt

from interp.attribution.export import INDEX_FILE, feature_code, graph_to_json, write_graph
from interp.attribution.graph import AttributionGraph, attribute
from interp.attribution.prune import prune

METADATA = {"slug": str, "scan": str, "transcoder_list": list, "prompt_tokens": list,
            "prompt": str, "node_threshold": (float, type(None)), "schema_version": int}
QPARAMS = {"pinnedIds": list, "supernodes": list, "linkType": str, "clickedId": str,
           "sg_pos": str}
NODE = {"node_id": str, "feature": int, "layer": str, "ctx_idx": int, "feature_type": str,
        "token_prob": float, "is_target_logit": bool, "run_idx": int, "reverse_ctx_idx": int,
        "jsNodeId": str, "clerp": str, "influence": (float, type(None)),
        "activation": (float, type(None))}
LINK = {"source": str, "target": str, "weight": float}


def _types(record: dict, schema: dict, what: str):
    missing = set(schema) - set(record)
    assert not missing, f"{what} lacks {sorted(missing)}"
    for key, kind in schema.items():
        assert isinstance(record[key], kind), (what, key, record[key])


@pytest.fixture(scope="module")
def graph():
    model, tcs = model_and_transcoders("mha-rotary")
    g = attribute(model, tcs, prompt(model), max_logits=3, model_name="tiny",
                  transcoder_set="tiny/transcoders")
    g.node_influence = prune(g).node_influence
    return g


def test_schema_ids_and_links(graph, tmp_path):
    pruned = prune(graph, 0.8, 0.98)
    data = graph_to_json(graph, "tiny-graph", pruned.node_mask, pruned.edge_mask, 0.8)
    assert set(data) == {"metadata", "qParams", "nodes", "links"}
    _types(data["metadata"], METADATA, "metadata")
    _types(data["qParams"], QPARAMS, "qParams")
    assert data["metadata"]["prompt_tokens"] == graph.prompt_tokens
    kinds = {}
    for node in data["nodes"]:
        _types(node, NODE, node["node_id"])
        kinds.setdefault(node["feature_type"], []).append(node)
    assert set(kinds) <= {"cross layer transcoder", "mlp reconstruction error", "embedding",
                          "logit"}
    assert len(kinds["embedding"]) == graph.n_pos and len(kinds["logit"]) == graph.n_logits
    for node in kinds["cross layer transcoder"]:
        layer, feature, pos = map(int, node["node_id"].split("_"))
        index = graph.feature_index(layer, pos, feature)
        assert node["feature"] == feature_code(layer, feature)
        assert node["activation"] == pytest.approx(float(graph.activations[index]))
        assert node["jsNodeId"] == f"{layer}_{feature}-0" and node["ctx_idx"] == pos
    for node in kinds.get("mlp reconstruction error", []):
        layer, minus_one, pos = node["node_id"].split("_")
        assert minus_one == "-1" and node["feature"] == -1
    for node in kinds["logit"]:
        assert node["layer"] == str(graph.n_layers + 1) and node["ctx_idx"] == graph.n_pos - 1
        assert node["clerp"].startswith("Output ")
    assert sum(n["is_target_logit"] for n in kinds["logit"]) == 1
    ids = {n["node_id"] for n in data["nodes"]}
    assert len(ids) == len(data["nodes"])
    for link in data["links"]:
        _types(link, LINK, "link")
        assert link["source"] in ids and link["target"] in ids
    assert len(data["links"]) == int(pruned.edge_mask.sum())
    # every feature kept has a link; the weights are the adjacency's
    linked = {x for link in data["links"] for x in (link["source"], link["target"])}
    assert all(n["node_id"] in linked for n in kinds["cross layer transcoder"])
    by_id = {n["node_id"]: i for i, n in enumerate(data["nodes"])}
    assert len(by_id) == len(ids)
    weights = sorted(abs(link["weight"]) for link in data["links"])
    kept = sorted(graph.adjacency[pruned.edge_mask].abs().tolist())
    assert weights == pytest.approx(kept)


def test_unpruned_export_keeps_every_nonzero_edge(graph):
    data = graph_to_json(graph, "all")
    assert len(data["links"]) == int((graph.adjacency != 0).sum())


def test_write_keeps_other_graphs_and_replaces_the_same_slug(graph, tmp_path):
    (tmp_path / INDEX_FILE).write_text(json.dumps({"graphs": [{"slug": "theirs", "scan": "x"}]}))
    write_graph(graph, tmp_path, "ours", node_threshold=0.8)
    write_graph(graph, tmp_path, "ours", node_threshold=0.5)
    index = json.loads((tmp_path / INDEX_FILE).read_text())
    assert [g["slug"] for g in index["graphs"]] == ["theirs", "ours"]
    assert index["graphs"][1]["node_threshold"] == 0.5
    assert json.loads((tmp_path / "ours.json").read_text())["metadata"]["slug"] == "ours"
    assert not list(tmp_path.glob(".*tmp"))
    (tmp_path / INDEX_FILE).write_text("{not json")
    with pytest.raises(ValueError, match="is not valid JSON .* left as it is"):
        write_graph(graph, tmp_path, "again")
    assert (tmp_path / INDEX_FILE).read_text() == "{not json"     # the user's file untouched


def test_bad_input_is_named(graph):
    with pytest.raises(ValueError, match="slug must be a non-empty name"):
        graph_to_json(graph, "a/b")
    with pytest.raises(ValueError, match=r"node_mask must be \["):
        graph_to_json(graph, "x", node_mask=torch.ones(3, dtype=torch.bool))
    fields = {k: getattr(graph, k) for k in AttributionGraph.__dataclass_fields__}
    fake = AttributionGraph(**{**fields, "activations": graph.activations[:-1]})
    with pytest.raises(ValueError, match="graph.activations has"):
        graph_to_json(fake, "x")
