"""Write attribution graphs as the JSON that circuit-tracer's local graph server and
Neuronpedia's graph viewer read.

The format (checked against circuit-tracer's writer and its pydantic models, `Metadata`,
`QParams`, `Node`, `Link`, at commit 196e2ce, 2026): one file `<slug>.json` with

- `metadata`: slug, scan (the model and transcoder set), transcoder_list, prompt_tokens,
  prompt, node_threshold, schema_version (1), and our `info` (generator, model, variant);
- `qParams`: the viewer's initial state (nothing pinned, `linkType` "both");
- `nodes`: every kept node with node_id, feature, layer, ctx_idx, feature_type, token_prob,
  is_target_logit, run_idx, reverse_ctx_idx, jsNodeId, clerp, influence, activation. Ids:
  features `"{layer}_{feature}_{pos}"`, errors `"{layer}_-1_{pos}"`, embeddings
  `"E_{token id}_{pos}"`, logits `"{n_layers + 1}_{token id}_{pos}"`; feature types "cross
  layer transcoder" (the viewer's name for transcoder features, per-layer ones included),
  "mlp reconstruction error", "embedding", "logit";
- `links`: `{source, target, weight}` for each kept edge, weight the direct effect.

Nodes without a kept edge are left out, except embeddings and logits (as circuit-tracer does).
Beside the graphs, `graph-metadata.json` lists every graph's metadata (`{"graphs": [...]}`);
the server reads it to offer the graphs.

Example:
    >>> write_graph(graph, "graphs/", "mha-induction", node_mask=pruned.node_mask,  # doctest: +SKIP
    ...             edge_mask=pruned.edge_mask, node_threshold=0.8)
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

SCHEMA_VERSION = 1
INDEX_FILE = "graph-metadata.json"


def viewer_token(token: str) -> str:
    """A token as the viewer shows it: line breaks, tabs and carriage returns made visible."""
    return token.replace("\n", "⏎").replace("\t", "→").replace("\r", "↵")


def feature_code(layer: int, feature: int) -> int:
    """One integer per (layer, feature) (Cantor pairing), for the viewer's `feature` field."""
    return (layer + feature) * (layer + feature + 1) // 2 + feature


def _check(graph, node_mask, edge_mask) -> tuple[torch.Tensor, torch.Tensor]:
    n = graph.n_nodes
    if tuple(graph.adjacency.shape) != (n, n):
        raise ValueError(f"graph.adjacency must be [{n}, {n}] (features + errors + embeddings + "
                         f"logits), got {tuple(graph.adjacency.shape)}")
    if graph.features.ndim != 2 or graph.features.shape[1] != 3:
        raise ValueError(f"graph.features must be [n_features, 3] (layer, pos, feature), got "
                         f"{tuple(graph.features.shape)}")
    if len(graph.activations) != graph.n_features:
        raise ValueError(f"graph.activations has {len(graph.activations)} entries for "
                         f"{graph.n_features} features")
    if len(graph.logit_token_strings) != graph.n_logits or \
            len(graph.logit_probabilities) != graph.n_logits:
        raise ValueError("graph.logit_token_strings and graph.logit_probabilities must have one "
                         f"entry per logit token ({graph.n_logits})")
    node_mask = torch.ones(n, dtype=torch.bool) if node_mask is None else node_mask.bool()
    edge_mask = (graph.adjacency != 0) if edge_mask is None else edge_mask.bool()
    if tuple(node_mask.shape) != (n,):
        raise ValueError(f"node_mask must be [{n}], got {tuple(node_mask.shape)}")
    if tuple(edge_mask.shape) != (n, n):
        raise ValueError(f"edge_mask must be [{n}, {n}], got {tuple(edge_mask.shape)}")
    return node_mask, edge_mask


def _node(graph, index: int, influence) -> dict:
    node = dict(token_prob=0.0, is_target_logit=False, run_idx=0, reverse_ctx_idx=0, clerp="",
                influence=None if influence is None else float(influence[index]),
                activation=None)
    kind = graph.node_kind(index)
    if kind == "feature":
        layer, pos, feature = graph.features[index].tolist()
        labels = getattr(graph, "feature_labels", None) or {}
        node.update(node_id=f"{layer}_{feature}_{pos}", feature=feature_code(layer, feature),
                    layer=str(layer), ctx_idx=pos, feature_type="cross layer transcoder",
                    jsNodeId=f"{layer}_{feature}-0", clerp=labels.get((layer, feature), ""),
                    activation=float(graph.activations[index]))
    elif kind == "error":
        layer, pos = divmod(index - graph.n_features, graph.n_pos)
        node.update(node_id=f"{layer}_-1_{pos}", feature=-1, layer=str(layer), ctx_idx=pos,
                    feature_type="mlp reconstruction error", jsNodeId=f"{layer}_-1-{pos}")
    elif kind == "embedding":
        pos = index - graph.n_features - graph.n_errors
        token = int(graph.tokens[pos])
        node.update(node_id=f"E_{token}_{pos}", feature=pos, layer="E", ctx_idx=pos,
                    feature_type="embedding", jsNodeId=f"E_{token}-{pos}")
    else:
        i = index - (graph.n_nodes - graph.n_logits)
        token, pos, prob = int(graph.logit_tokens[i]), graph.n_pos - 1, \
            float(graph.logit_probabilities[i])
        layer = str(graph.n_layers + 1)
        node.update(node_id=f"{layer}_{token}_{pos}", feature=token, layer=layer, ctx_idx=pos,
                    feature_type="logit", token_prob=prob,
                    is_target_logit=i == getattr(graph, "target_logit", 0),
                    jsNodeId=f"L_{token}-{pos}",
                    clerp=f'Output "{viewer_token(graph.logit_token_strings[i])}" (p={prob:.3f})')
    return {key: node[key] for key in ("node_id", "feature", "layer", "ctx_idx", "feature_type",
                                       "token_prob", "is_target_logit", "run_idx",
                                       "reverse_ctx_idx", "jsNodeId", "clerp", "influence",
                                       "activation")}


def graph_to_json(graph, slug: str, node_mask=None, edge_mask=None,
                  node_threshold: float | None = None) -> dict:
    """The viewer's JSON of `graph` (masks: `[n_nodes]` and `[n_nodes n_nodes]`, from
    `interp.attribution.prune`; None keeps every node and every nonzero edge)."""
    if not isinstance(slug, str) or not slug or "/" in slug:
        raise ValueError(f"slug must be a non-empty name without '/', got {slug!r}")
    node_mask, edge_mask = _check(graph, node_mask, edge_mask)
    influence = getattr(graph, "node_influence", None)
    nodes = {i: _node(graph, i, influence) for i in node_mask.nonzero().flatten().tolist()}
    links = []
    for target, source in (edge_mask & (graph.adjacency != 0)).nonzero().tolist():
        if source in nodes and target in nodes:
            links.append(dict(source=nodes[source]["node_id"], target=nodes[target]["node_id"],
                              weight=float(graph.adjacency[target, source])))
    linked = {link["source"] for link in links} | {link["target"] for link in links}
    kept = [n for n in nodes.values()
            if n["node_id"] in linked or n["feature_type"] in ("embedding", "logit")]
    transcoder_set = getattr(graph, "transcoder_set", "") or ""
    metadata = dict(slug=slug, scan=f"attnlens-{graph.model_name}" if graph.model_name
                    else "attnlens", transcoder_list=[transcoder_set] if transcoder_set else [],
                    prompt_tokens=[viewer_token(t) for t in graph.prompt_tokens],
                    prompt=graph.prompt, node_threshold=node_threshold,
                    schema_version=SCHEMA_VERSION,
                    info=dict(generator="attnlens interp.attribution", model=graph.model_name,
                              transcoders=transcoder_set, error_share=graph.error_share()))
    q_params = dict(pinnedIds=[], supernodes=[], linkType="both", clickedId="", sg_pos="")
    return dict(metadata=metadata, qParams=q_params, nodes=kept, links=links)


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_graph(graph, directory, slug: str, **kw) -> Path:
    """Write `<slug>.json` into `directory` and list it in `graph-metadata.json` (other graphs'
    entries are kept; one with the same slug is replaced). Returns the graph file's path."""
    data = graph_to_json(graph, slug, **kw)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{slug}.json"
    _atomic_write(path, json.dumps(data, indent=2, ensure_ascii=False))
    index_path = directory / INDEX_FILE
    index = {"graphs": []}
    if index_path.is_file():
        try:
            index = json.loads(index_path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise ValueError(f"{index_path} is not valid JSON ({err}); it is left as it is: fix "
                             "or move it, then write the graph again") from None
        if not isinstance(index, dict) or not isinstance(index.get("graphs"), list):
            raise ValueError(f"{index_path} is not a graph list ({{\"graphs\": [...]}}); it is "
                             "left as it is")
    meta = {k: v for k, v in data["metadata"].items() if k != "info"}
    index["graphs"] = [g for g in index["graphs"] if g.get("slug") != slug] + [meta]
    _atomic_write(index_path, json.dumps(index, indent=2, ensure_ascii=False))
    return path


__all__ = ["INDEX_FILE", "feature_code", "graph_to_json", "viewer_token", "write_graph"]
