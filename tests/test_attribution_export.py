"""Graph JSON for circuit-tracer's local server and Neuronpedia's viewer
(attnlens.interp.attribution.export). The expected fields, types, ids and values are those of a
graph written by circuit-tracer 0.5.0's own writer (tests/data/circuit_tracer/, see its README) and
of its pydantic models (Metadata, QParams, Node, Link, Model); circuit-tracer is not imported here.
Error-node ids follow upstream circuit-tracer (commit 196e2ce), not the 0.5.0 wheel."""

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from attribution_models import model_and_transcoders, prompt

from attnlens.interp.attribution.export import (
    INDEX_FILE,
    feature_code,
    graph_to_json,
    influence_scores,
    write_graph,
)
from attnlens.interp.attribution.graph import AttributionGraph, attribute
from attnlens.interp.attribution.prune import normalized, path_influence, prune

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
    with pytest.raises(ValueError, match="slug must be a non-empty file name"):
        graph_to_json(graph, "a/b")
    with pytest.raises(ValueError, match=r"node_mask must be \["):
        graph_to_json(graph, "x", node_mask=torch.ones(3, dtype=torch.bool))
    fields = {k: getattr(graph, k) for k in AttributionGraph.__dataclass_fields__}
    fake = AttributionGraph(**{**fields, "activations": graph.activations[:-1]})
    with pytest.raises(ValueError, match="graph.activations has"):
        graph_to_json(fake, "x")


# --- against a graph written by circuit-tracer's own writer --------------------------------
# tests/data/circuit_tracer/graph_example.json was written by circuit-tracer 0.5.0's
# create_graph_files from the synthetic graph below (tests/data/circuit_tracer/README.md).
# The fake graph here is that graph in our form (a SimpleNamespace with the attributes
# export.py reads); exporting it with the writer's kept nodes and edges must give the same
# JSON, except error-node ids (0.5.0 writes "0_{layer}_{pos}", we write upstream's newer
# "{layer}_-1_{pos}") and our extra metadata.info.

FIXTURES = Path(__file__).parent / "data" / "circuit_tracer"
CT_FEATURES = [(0, 0, 3), (0, 1, 4), (0, 2, 7), (1, 1, 4), (1, 2, 6), (1, 2, 9)]
CT_ACTIVATIONS = [1.5, 0.75, 2.0, 1.25, 3.0, 0.5]
CT_LAYERS, CT_POS, CT_TOKENS, CT_LOGITS = 2, 3, [1, 2, 3], [4, 7]
CT_N = len(CT_FEATURES) + CT_LAYERS * CT_POS + CT_POS + len(CT_LOGITS)      # 17


def _err(layer, pos):
    return len(CT_FEATURES) + layer * CT_POS + pos


def _emb(pos):
    return len(CT_FEATURES) + CT_LAYERS * CT_POS + pos


def _logit(i):
    return CT_N - len(CT_LOGITS) + i


# (target, source, weight), as in the fixture's script
CT_EDGES = [(0, _emb(0), 0.9), (1, _emb(1), 0.8), (1, _emb(0), 0.2), (2, _emb(2), 1.1),
            (2, 1, -0.3), (3, 1, 0.6), (3, _err(0, 1), 0.1), (4, 2, 1.2), (4, 3, 0.7),
            (4, _err(0, 2), -0.6), (4, _emb(2), 0.05), (5, 0, 0.01), (5, _emb(2), 0.02),
            (_err(1, 2), 2, 0.5), (_err(1, 2), _emb(2), 0.1), (_logit(0), 4, 2.0),
            (_logit(0), 2, 0.5), (_logit(0), _err(1, 2), 1.0), (_logit(0), _emb(2), 0.3),
            (_logit(0), 5, 0.01), (_logit(1), 4, -0.8), (_logit(1), 2, 0.6),
            (_logit(1), _emb(2), 0.2)]


def ct_graph(**overrides):
    adjacency = torch.zeros(CT_N, CT_N)
    for target, source, weight in CT_EDGES:
        adjacency[target, source] = weight
    probabilities = torch.tensor([0.625, 0.25])
    weights = torch.zeros(CT_N)
    weights[-2:] = probabilities
    fields = dict(prompt="The cat sat", prompt_tokens=["The", " cat", " sat"],
                  tokens=torch.tensor(CT_TOKENS), model_name="fixture-2l", n_layers=CT_LAYERS,
                  n_pos=CT_POS, features=torch.tensor(CT_FEATURES),
                  activations=torch.tensor(CT_ACTIVATIONS), logit_tokens=torch.tensor(CT_LOGITS),
                  logit_token_strings=[" on", " down"], logit_probabilities=probabilities,
                  target_logit=0, adjacency=adjacency,
                  node_influence=path_influence(normalized(adjacency), weights),
                  transcoder_set="fixture/transcoders")
    fields.update(overrides)
    return SimpleNamespace(**fields)


def ct050_ids(index: int) -> tuple[str, str]:
    """(node_id, jsNodeId) circuit-tracer 0.5.0 writes for node `index` of the fake graph."""
    if index < len(CT_FEATURES):
        layer, pos, feat = CT_FEATURES[index]
        return f"{layer}_{feat}_{pos}", f"{layer}_{feat}-0"
    if index < _emb(0):
        layer, pos = divmod(index - len(CT_FEATURES), CT_POS)
        return f"0_{layer}_{pos}", f"{layer}_{pos}-0"
    if index < _logit(0):
        pos = index - _emb(0)
        return f"E_{CT_TOKENS[pos]}_{pos}", f"E_{CT_TOKENS[pos]}-{pos}"
    token = CT_LOGITS[index - _logit(0)]
    return f"{CT_LAYERS + 1}_{token}_{CT_POS - 1}", f"L_{token}-{CT_POS - 1}"


@pytest.fixture(scope="module")
def ct():
    data = json.loads((FIXTURES / "graph_example.json").read_text())
    index_of = {ct050_ids(i)[0]: i for i in range(CT_N)}
    node_mask = torch.zeros(CT_N, dtype=torch.bool)
    node_mask[[index_of[n["node_id"]] for n in data["nodes"]]] = True
    edge_mask = torch.zeros(CT_N, CT_N, dtype=torch.bool)
    for link in data["links"]:
        edge_mask[index_of[link["target"]], index_of[link["source"]]] = True
    return SimpleNamespace(data=data, node_mask=node_mask, edge_mask=edge_mask,
                           index_of=index_of)


def json_type(value) -> str:
    return {bool: "bool", int: "int", float: "float", str: "str", list: "list", dict: "dict",
            type(None): "null"}[type(value)]


def test_fixture_is_circuit_tracers_format(ct):
    """What the fixture itself says (a guard against regenerating it carelessly)."""
    data = ct.data
    assert list(data) == ["metadata", "qParams", "nodes", "links"]
    kinds = {n["feature_type"] for n in data["nodes"]}
    assert kinds == {"cross layer transcoder", "mlp reconstruction error", "embedding", "logit"}
    index = json.loads((FIXTURES / INDEX_FILE).read_text())
    assert [g["slug"] for g in index["graphs"]] == ["graph_example", "graph_example_list_scan"]
    assert index["graphs"][0] == data["metadata"]
    assert index["graphs"][1]["scan"].startswith("custom-")


def test_same_json_as_circuit_tracers_writer(ct):
    ours = graph_to_json(ct_graph(), "graph_example", ct.node_mask, ct.edge_mask, 0.9)
    theirs = ct.data
    assert list(ours) == list(theirs)
    assert json.loads(json.dumps(ours, allow_nan=False)) == ours       # plain JSON values
    # metadata: their keys in their order, plus Neuronpedia's optional info
    assert list(ours["metadata"]) == list(theirs["metadata"]) + ["info"]
    for key, value in theirs["metadata"].items():
        if key not in ("slug", "scan", "transcoder_list"):
            assert ours["metadata"][key] == value, key
        assert json_type(ours["metadata"][key]) == json_type(value), key
    assert ours["metadata"]["scan"] == "fixture-2l"
    info = ours["metadata"]["info"]
    assert info["generator"]["name"] == "attnlens" and info["transcoder_set"] == \
        "fixture/transcoders" and info["model"] == "fixture-2l"
    assert ours["qParams"] == theirs["qParams"]
    # nodes: same nodes in the same order, same keys in the same order, same JSON types
    assert len(ours["nodes"]) == len(theirs["nodes"])
    for mine, their in zip(ours["nodes"], theirs["nodes"], strict=True):
        assert list(mine) == list(their), their["node_id"]
        for key, value in their.items():
            assert json_type(mine[key]) == json_type(value), (their["node_id"], key)
            if key == "influence" and value is not None:
                assert mine[key] == pytest.approx(value, rel=1e-5), their["node_id"]
            elif key not in ("node_id", "jsNodeId"):
                assert mine[key] == value, (their["node_id"], key)
        i = ct.index_of[their["node_id"]]
        assert (mine["node_id"], mine["jsNodeId"]) == (
            ct050_ids(i) if their["feature_type"] != "mlp reconstruction error" else
            (f"{their['layer']}_-1_{their['ctx_idx']}", f"{their['layer']}_-1-{their['ctx_idx']}"))
    # links: the same edges in the same order with the same weights
    rename = {t["node_id"]: m["node_id"] for m, t in zip(ours["nodes"], theirs["nodes"],
                                                         strict=True)}
    assert [(link["source"], link["target"]) for link in ours["links"]] == \
        [(rename[link["source"]], rename[link["target"]]) for link in theirs["links"]]
    assert [link["weight"] for link in ours["links"]] == \
        pytest.approx([link["weight"] for link in theirs["links"]], rel=1e-7)
    assert all(list(mine) == list(their) for mine, their in zip(ours["links"], theirs["links"],
                                                                 strict=True))


def test_ids_links_and_round_trip_weights():
    graph = ct_graph(feature_labels={(1, 6): "says 'on'"})
    data = graph_to_json(graph, "all")
    patterns = {"cross layer transcoder": r"\d+_\d+_\d+", "mlp reconstruction error": r"\d+_-1_\d+",
                "embedding": r"E_\d+_\d+", "logit": rf"{CT_LAYERS + 1}_\d+_{CT_POS - 1}"}
    ids = [n["node_id"] for n in data["nodes"]]
    assert len(ids) == len(set(ids))
    assert len({n["jsNodeId"] for n in data["nodes"]}) == len(ids)
    for node in data["nodes"]:
        assert re.fullmatch(patterns[node["feature_type"]], node["node_id"]), node["node_id"]
    by_id = {n["node_id"]: n for n in data["nodes"]}
    assert by_id["1_6_2"]["clerp"] == "says 'on'" and by_id["1_6_2"]["activation"] == 3.0
    assert by_id["1_6_2"]["feature"] == feature_code(1, 6) == 34
    assert [n["is_target_logit"] for n in data["nodes"] if n["feature_type"] == "logit"] == \
        [True, False]
    assert by_id["3_7_2"]["clerp"] == 'Output " down" (p=0.250)'
    # every nonzero edge comes back, with its weight, between ids that are present
    assert len(data["links"]) == len(CT_EDGES)
    index_of = {ct050_ids(i)[0]: i for i in range(CT_N)}
    index_of.update({f"{layer}_-1_{pos}": _err(layer, pos)
                     for layer in range(CT_LAYERS) for pos in range(CT_POS)})
    for link in data["links"]:
        assert link["source"] in by_id and link["target"] in by_id
        target, source = index_of[link["target"]], index_of[link["source"]]
        assert link["weight"] == float(graph.adjacency[target, source])
    # influence: circuit-tracer's score in (0, 1], smallest for the most influential node
    # (here the last token's embedding), None on logits
    scores = {i: n["influence"] for i, n in by_id.items() if n["feature_type"] != "logit"}
    assert all(0 < v <= 1 for v in scores.values())
    assert min(scores, key=scores.get) == "E_3_2"
    assert by_id["3_4_2"]["influence"] is None
    no_influence = graph_to_json(ct_graph(node_influence=None), "x")
    assert {n["influence"] for n in no_influence["nodes"]} == {None}


def test_influence_scores_are_cumulative_shares():
    scores = influence_scores(torch.tensor([0.1, 0.6, 0.0, 0.3]))
    assert scores.tolist() == pytest.approx([1.0, 0.6, 1.0, 0.9])
    assert influence_scores(torch.zeros(3)).tolist() == [1.0, 1.0, 1.0]


def test_masks_drop_nodes_and_edges():
    graph = ct_graph()
    node_mask = torch.ones(CT_N, dtype=torch.bool)
    node_mask[4] = False                                   # feature (1, 2, 6)
    edge_mask = torch.ones(CT_N, CT_N, dtype=torch.bool)
    edge_mask[_logit(1), 2] = False                        # 0_7_2 -> the second logit
    data = graph_to_json(graph, "masked", node_mask, edge_mask)
    ids = {n["node_id"] for n in data["nodes"]}
    assert "1_6_2" not in ids
    pairs = {(link["source"], link["target"]) for link in data["links"]}
    assert not any("1_6_2" in pair for pair in pairs)
    assert ("0_7_2", "3_7_2") not in pairs and ("0_7_2", "3_4_2") in pairs
    assert len(data["links"]) == len(CT_EDGES) - 6 - 1     # 6 edges touch 1_6_2
    # a node left without links goes, unless it is an embedding or a logit
    lonely = torch.zeros(CT_N, dtype=torch.bool)
    lonely[[0, _emb(0), _logit(0)]] = True
    data = graph_to_json(graph, "lonely", lonely, torch.zeros(CT_N, CT_N, dtype=torch.bool))
    assert [n["node_id"] for n in data["nodes"]] == ["E_1_0", "3_4_2"] and data["links"] == []


def test_write_graph_keeps_the_users_index(tmp_path):
    index = {"graphs": [{"slug": "theirs", "scan": "gemma-2-2b", "prompt": "hi"}, "odd entry"],
             "note": "kept"}
    (tmp_path / INDEX_FILE).write_text(json.dumps(index))
    (tmp_path / "theirs.json").write_text("{}")
    path = write_graph(ct_graph(), tmp_path, "ours", node_threshold=0.8)
    assert path == tmp_path / "ours.json"
    write_graph(ct_graph(), tmp_path, "ours", node_threshold=0.5)
    written = json.loads((tmp_path / INDEX_FILE).read_text())
    assert written["note"] == "kept" and written["graphs"][:2] == index["graphs"]
    entry = written["graphs"][2]
    assert len(written["graphs"]) == 3 and entry["slug"] == "ours"
    assert entry["node_threshold"] == 0.5
    metadata_keys = json.loads((FIXTURES / INDEX_FILE).read_text())["graphs"][0].keys()
    assert list(entry) == list(metadata_keys)              # circuit-tracer's Metadata fields
    assert json.loads(path.read_text())["metadata"]["node_threshold"] == 0.5
    assert (tmp_path / "theirs.json").read_text() == "{}"
    assert sorted(p.name for p in tmp_path.iterdir()) == [INDEX_FILE, "ours.json",
                                                         "theirs.json"]
    # no index yet: one is made; an unreadable one stops the write before anything changes
    fresh = tmp_path / "fresh"
    write_graph(ct_graph(), fresh, "a")
    assert [g["slug"] for g in json.loads((fresh / INDEX_FILE).read_text())["graphs"]] == ["a"]
    (fresh / INDEX_FILE).write_text("[1, 2]")
    with pytest.raises(ValueError, match="is not a graph list"):
        write_graph(ct_graph(), fresh, "b")
    assert (fresh / INDEX_FILE).read_text() == "[1, 2]" and not (fresh / "b.json").exists()
    with pytest.raises(ValueError, match="would overwrite the graph list"):
        write_graph(ct_graph(), fresh, "graph-metadata")
    assert (fresh / INDEX_FILE).read_text() == "[1, 2]"


def test_no_threshold_leaves_the_key_out():
    metadata = graph_to_json(ct_graph(), "x")["metadata"]
    assert "node_threshold" not in metadata and metadata["schema_version"] == 1


@pytest.mark.parametrize("change, message", [
    (dict(features=torch.zeros(6, 2, dtype=torch.long)), r"graph.features must be"),
    (dict(features=torch.tensor([[2, 0, 1]] * 6)), r"graph.features has a row \(layer 2"),
    (dict(features=torch.tensor([[0, 0, 1]] * 6)), r"graph.features has repeated"),
    (dict(activations=torch.ones(5)), r"graph.activations has 5 entries; it needs 6"),
    (dict(prompt_tokens=["a", "b"]), r"graph.prompt_tokens has 2 tokens but graph.n_pos is 3"),
    (dict(logit_token_strings=[" on"]), r"graph.logit_token_strings has 1 entries for 2"),
    (dict(logit_probabilities=torch.ones(3)), r"graph.logit_probabilities has 3 entries"),
    (dict(target_logit=2), r"graph.target_logit is 2"),
    (dict(adjacency=torch.zeros(16, 16)), r"graph.adjacency must be \[17, 17\]"),
    (dict(adjacency=torch.full((17, 17), float("nan"))), r"graph.adjacency has NaN"),
    (dict(node_influence=torch.ones(16)), r"graph.node_influence has 16 entries; it needs 17"),
    (dict(tokens=torch.tensor([1, 2])), r"graph.tokens has 2 entries; it needs 3"),
])
def test_bad_graph_is_named(change, message):
    with pytest.raises(ValueError, match=message):
        graph_to_json(ct_graph(**change), "x")


def test_bad_masks_and_slugs_are_named():
    graph = ct_graph()
    with pytest.raises(ValueError, match=r"node_mask must be \[17\] for this graph, got \[16\]"):
        graph_to_json(graph, "x", node_mask=torch.ones(16, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"edge_mask must be \[17, 17\]"):
        graph_to_json(graph, "x", edge_mask=torch.ones(17, dtype=torch.bool))
    for slug in ("", "a/b", "a\\b", ".hidden", None):
        with pytest.raises(ValueError, match="slug must be a non-empty file name"):
            graph_to_json(graph, slug)
    with pytest.raises(ValueError, match="node_threshold must be a number"):
        graph_to_json(graph, "x", node_threshold=float("nan"))
