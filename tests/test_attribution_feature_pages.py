"""Feature pages beside a graph (attnlens.interp.attribution.contexts.write_feature_pages): every
feature node of the written graph has its page where circuit-tracer's viewer looks for it
(`{scan}/{feature}.json`, scan "./graph_data/...", served from the local server's data_dir),
with the fields its example and logit lists read, and the examples are the feature's top
contexts with its activations."""

import json

import pytest
import torch
from attribution_models import model_and_transcoders, prompt

from attnlens.interp.attribution.contexts import (
    feature_activations,
    feature_scan,
    top_contexts,
    write_feature_pages,
)
from attnlens.interp.attribution.export import feature_code, write_graph
from attnlens.interp.attribution.graph import attribute
from attnlens.interp.attribution.prune import prune

EXAMPLE = {"tokens": list, "tokens_acts_list": list, "train_token_ind": int,
           "is_repeated_datapoint": bool}


def _viewer_path(data_dir, scan, code):
    """Where the viewer's request for a feature lands: loadFeature fetches `${scan}/${code}.json`
    for a scan starting with "./"; the local server maps /graph_data/ to data_dir."""
    assert scan.startswith("./graph_data/")
    return data_dir / scan[len("./graph_data/"):] / f"{code}.json"


def test_pages_sit_where_the_viewer_reads_them(tmp_path):
    model, tcs = model_and_transcoders("mha-rotary")
    graph = attribute(model, tcs, prompt(model), max_logits=2, model_name="tiny model/1")
    pruned = prune(graph, 0.8, 0.98)
    tokens = torch.randint(0, model.cfg.d_vocab, (6, 20), generator=torch.Generator()
                           .manual_seed(3))
    scan, paths = write_feature_pages(model, tcs, graph, tmp_path, graph.model_name, tokens,
                                      node_mask=pruned.node_mask, n=3)
    assert scan == feature_scan("tiny model/1") == "./graph_data/features/tiny-model-1"
    path = write_graph(graph, tmp_path, "paged", node_mask=pruned.node_mask,
                       edge_mask=pruned.edge_mask, scan=scan)
    data = json.loads(path.read_text())
    assert data["metadata"]["scan"] == scan
    feature_nodes = [n for n in data["nodes"] if n["feature_type"] == "cross layer transcoder"]
    assert feature_nodes and len(paths) == len({(n["layer"], n["feature"])
                                                for n in feature_nodes})
    acts = {layer: feature_activations(model, tc, tokens) for layer, tc in tcs.items()}
    for node in feature_nodes:
        layer, index, _ = map(int, node["node_id"].split("_"))
        assert node["feature"] == feature_code(layer, index)
        page = json.loads(_viewer_path(tmp_path, scan, node["feature"]).read_text())
        assert (page["layer"], page["index"]) == (layer, index)
        assert page["act_max"] == pytest.approx(float(acts[layer][..., index].max()))
        assert len(page["top_logits"]) == len(page["bottom_logits"]) == 8
        (quantile,) = page["examples_quantiles"]
        assert quantile["quantile_name"] == "Top activations"
        expected = top_contexts(model, acts[layer], tokens, index, n=3)
        assert len(quantile["examples"]) == len(expected)
        for example, context in zip(quantile["examples"], expected, strict=True):
            for key, kind in EXAMPLE.items():
                assert isinstance(example[key], kind), key
            assert len(example["tokens"]) == len(example["tokens_acts_list"])
            peak = example["tokens_acts_list"][example["train_token_ind"]]
            assert peak == pytest.approx(context.activation)
    # a graph without pages keeps the model name as its scan
    plain = json.loads(write_graph(graph, tmp_path, "plain").read_text())
    assert plain["metadata"]["scan"] == "tiny model/1"


def test_bad_requests_are_named(tmp_path):
    model, tcs = model_and_transcoders("mha-rotary")
    graph = attribute(model, tcs, prompt(model), max_logits=1)
    with pytest.raises(ValueError, match="tokens must be"):
        write_feature_pages(model, tcs, graph, tmp_path, "x", torch.zeros(0, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="a name with a letter"):
        write_feature_pages(model, tcs, graph, tmp_path, "//", torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="scan must be"):
        write_graph(graph, tmp_path, "s", scan="")
