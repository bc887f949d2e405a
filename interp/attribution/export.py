"""Write attribution graphs as the JSON that circuit-tracer's local graph server and
Neuronpedia's graph viewer read.

The format is the one circuit-tracer's writer (`circuit_tracer.utils.create_graph_files`)
produces through its pydantic models (`Metadata`, `QParams`, `Node`, `Link`, `Model` in
`circuit_tracer/frontend/graph_models.py`), checked against circuit-tracer 0.5.0 from PyPI
and upstream commit 196e2ce; `tests/data/circuit_tracer/` holds a graph written by that writer.
One file `<slug>.json`:

- `metadata`: slug, scan (our model name: Neuronpedia reads it as the model id; or, with
  feature pages written beside the graph, their path: `contexts.write_feature_pages`),
  transcoder_list (empty, as circuit-tracer writes for a named scan), prompt_tokens, prompt,
  node_threshold (left out when None: Neuronpedia's schema wants a number), schema_version (1)
  and `info` (Neuronpedia's optional block: generator {name, version}, description, and ours:
  model, transcoder_set, error_share);
- `qParams`: the viewer's saved state, empty (nothing pinned, `linkType` "both");
- `nodes`, in node order (features, errors, embeddings, logits), each with node_id, feature,
  layer, ctx_idx, feature_type, token_prob, is_target_logit, run_idx, reverse_ctx_idx,
  jsNodeId, clerp, influence, activation:

  - feature: node_id `{layer}_{feat}_{pos}`, jsNodeId `{layer}_{feat}-0`, feature = the
    Cantor pair of (layer, feat), layer "{layer}";
  - error: node_id `{layer}_-1_{pos}`, jsNodeId `{layer}_-1-{pos}`, feature -1, layer
    "{layer}";
  - embedding: node_id `E_{token id}_{pos}`, jsNodeId `E_{token id}-{pos}`, feature = pos,
    layer "E";
  - logit: node_id `{L+1}_{token id}_{P}`, jsNodeId `L_{token id}-{P}`, feature = token id,
    layer "{L+1}", token_prob, is_target_logit, clerp `Output "{token}" (p=0.625)`;

  (L = n_layers, P = the last position). Feature types: "cross layer transcoder" (the only
  transcoder type the viewers know; circuit-tracer writes it for per-layer transcoders too),
  "mlp reconstruction error", "embedding", "logit". Error ids are upstream circuit-tracer's
  current ones; the 0.5.0 wheel still writes `0_{layer}_{pos}` / `{layer}_{pos}-0`, which
  collide with layer-0 feature ids. `influence` is circuit-tracer's node score (the share of
  the total influence held by the nodes at least as influential; the viewers keep nodes whose
  score is <= their pruning threshold), None for logits; `activation` only on features;
- `links`: `{source, target, weight}` per kept nonzero edge, weight = `adjacency[target,
  source]`, in (target, source) order.

On request (`head_loadings=`, `qk=`), one more top-level key, `attention`: attnlens's
extension, which circuit-tracer's pydantic `Model` (metadata, qParams, nodes, links) and both
viewers ignore (pydantic drops unknown keys; the viewers read only the four keys):

- `schema` (1), `head_kind` ("head", or "source head" for MTA and DCMHA: the head whose softmax
  map the post-softmax mixing draws on), `n_heads`;
- `loadings`: per kept link, `{source, target, heads, bypass}`: `heads[l][h]` is the link's
  weight carried by head h of layer l and `bypass[l]` what does not pass layer l's attention,
  so for every layer l `sum(heads[l]) + bypass[l] == weight` (exact; see
  `attnlens.interp.attribution.head_loadings`);
- `qk`: per head asked for, `{layer, head, query_pos, key_pos, stage, score, query_bias,
  key_bias, query, key}`, the two sides' largest sources as `{node_id, label, value}`
  (`attnlens.interp.attribution.qk`; a source's node_id may name a node the graph left out).

Nodes without a kept link are left out, except embeddings and logits (as circuit-tracer does).
Beside the graphs, `graph-metadata.json` (`{"graphs": [metadata, ...]}`, `info` left out) lists
the graphs the local server offers; `write_graph` keeps the other entries.

The graph is read by duck typing: prompt_tokens, prompt, model_name, n_layers, n_pos,
features `[n_features 3]` (layer, pos, feature), activations, logit_tokens,
logit_token_strings, logit_probabilities, target_logit, adjacency `[n_nodes n_nodes]`
(`[target, source]`), and optionally node_influence (raw path influence, as `prune` gives it),
feature_labels `{(layer, feature): text}`, tokens (the prompt's token ids, for embedding ids;
-1 without them) and transcoder_set.

Example:
    >>> write_graph(graph, "graphs/", "mha-induction", node_mask=pruned.node_mask,  # doctest: +SKIP
    ...             edge_mask=pruned.edge_mask, node_threshold=0.8)
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
from importlib import metadata as _metadata
from pathlib import Path

import torch

from attnlens.hooked_models.checkpoint import write_text_atomic

SCHEMA_VERSION = 1
ATTENTION_KEY = "attention"        # attnlens's extension, ignored by circuit-tracer's viewer
ATTENTION_SCHEMA = 1
INDEX_FILE = "graph-metadata.json"
FEATURE_TYPE = "cross layer transcoder"
ERROR_TYPE = "mlp reconstruction error"
NODE_FIELDS = ("node_id", "feature", "layer", "ctx_idx", "feature_type", "token_prob",
               "is_target_logit", "run_idx", "reverse_ctx_idx", "jsNodeId", "clerp",
               "influence", "activation")


def viewer_token(token: str) -> str:
    """A token as the viewer shows it: line breaks, tabs and carriage returns made visible."""
    return token.replace("\n", "⏎").replace("\t", "→").replace("\r", "↵")


def feature_code(layer: int, feature: int) -> int:
    """One integer per (layer, feature) (Cantor pairing), for the viewer's `feature` field."""
    return (layer + feature) * (layer + feature + 1) // 2 + feature


def influence_scores(influence: torch.Tensor) -> torch.Tensor:
    """circuit-tracer's per-node score from raw influence: sort the nodes by influence, most
    first, and give each the running share of the total (the top node its own share, the
    last ones 1.0). A threshold t on it keeps the nodes that together hold t of the influence.
    """
    influence = torch.as_tensor(influence).detach().double().flatten()
    total = float(influence.sum())
    if not total > 0:
        return torch.ones_like(influence)
    order = torch.argsort(influence, descending=True, stable=True)
    scores = torch.empty_like(influence)
    scores[order] = influence[order].cumsum(0) / total
    return scores.clamp(max=1.0)


class _Layout:
    """Node counts and offsets of a graph, and its checked tensors."""

    def __init__(self, graph):
        features = graph.features
        if not isinstance(features, torch.Tensor) or features.ndim != 2 \
                or features.shape[1] != 3:
            shape = tuple(features.shape) if isinstance(features, torch.Tensor) else type(features)
            raise ValueError("graph.features must be a [n_features, 3] tensor of (layer, pos, "
                             f"feature index) rows, got {shape}")
        self.n_layers, self.n_pos = int(graph.n_layers), int(graph.n_pos)
        if len(graph.prompt_tokens) != self.n_pos:
            raise ValueError(f"graph.prompt_tokens has {len(graph.prompt_tokens)} tokens but "
                             f"graph.n_pos is {self.n_pos}")
        self.features = features.long().tolist()
        self.n_features = len(self.features)
        for layer, pos, feature in self.features:
            if not (0 <= layer < self.n_layers and 0 <= pos < self.n_pos and feature >= 0):
                raise ValueError(f"graph.features has a row (layer {layer}, pos {pos}, feature "
                                 f"{feature}) outside {self.n_layers} layers x {self.n_pos} "
                                 "positions")
        if len(set(map(tuple, self.features))) != self.n_features:
            raise ValueError("graph.features has repeated (layer, pos, feature) rows; node ids "
                             "would collide")
        self.activations = _vector(graph.activations, self.n_features, "graph.activations",
                                   "one per feature")
        logit_tokens = graph.logit_tokens
        if not isinstance(logit_tokens, torch.Tensor) or logit_tokens.ndim != 1:
            raise ValueError("graph.logit_tokens must be a 1-d tensor of token ids")
        self.logit_tokens = logit_tokens.long().tolist()
        self.n_logits = len(self.logit_tokens)
        self.logit_strings = [str(s) for s in graph.logit_token_strings]
        if len(self.logit_strings) != self.n_logits:
            raise ValueError(f"graph.logit_token_strings has {len(graph.logit_token_strings)} "
                             f"entries for {self.n_logits} logit tokens")
        self.logit_probabilities = _vector(graph.logit_probabilities, self.n_logits,
                                           "graph.logit_probabilities", "one per logit token")
        self.target_logit = int(getattr(graph, "target_logit", 0))
        if self.n_logits and not 0 <= self.target_logit < self.n_logits:
            raise ValueError(f"graph.target_logit is {self.target_logit}, not an index into "
                             f"the {self.n_logits} logit tokens")
        self.errors = self.n_features
        self.embeddings = self.errors + self.n_layers * self.n_pos
        self.logits = self.embeddings + self.n_pos
        self.n_nodes = self.logits + self.n_logits
        n = self.n_nodes
        adjacency = graph.adjacency
        if not isinstance(adjacency, torch.Tensor) or tuple(adjacency.shape) != (n, n):
            shape = tuple(adjacency.shape) if isinstance(adjacency, torch.Tensor) else None
            raise ValueError(f"graph.adjacency must be [{n}, {n}] ({self.n_features} features "
                             f"+ {self.n_layers}x{self.n_pos} errors + {self.n_pos} embeddings "
                             f"+ {self.n_logits} logits), got {shape}")
        if not bool(torch.isfinite(adjacency).all()):
            raise ValueError("graph.adjacency has NaN or infinite entries (JSON cannot hold "
                             "them)")
        self.adjacency = adjacency.detach()
        influence = getattr(graph, "node_influence", None)
        self.influence = None if influence is None else influence_scores(
            _vector(influence, n, "graph.node_influence", "one per node")).tolist()
        tokens = getattr(graph, "tokens", None)
        self.tokens = [-1] * self.n_pos if tokens is None else [
            int(t) for t in _vector(tokens, self.n_pos, "graph.tokens", "one per position",
                                    finite=False)]

    def mask(self, mask, shape: tuple, what: str, default) -> torch.Tensor:
        if mask is None:
            return default
        mask = torch.as_tensor(mask)
        if tuple(mask.shape) != shape:
            raise ValueError(f"{what} must be {list(shape)} for this graph, got "
                             f"{list(mask.shape)}")
        return mask.bool()


def _vector(values, length: int, what: str, meaning: str, finite: bool = True) -> list:
    values = torch.as_tensor(values).detach().flatten()
    if values.numel() != length:
        raise ValueError(f"{what} has {values.numel()} entries; it needs {length} ({meaning})")
    if finite and values.is_floating_point() and not bool(torch.isfinite(values).all()):
        raise ValueError(f"{what} has NaN or infinite entries (JSON cannot hold them)")
    return values.tolist()


def _node(lay: _Layout, index: int, labels: dict) -> dict:
    node = dict(token_prob=0.0, is_target_logit=False, run_idx=0, reverse_ctx_idx=0, clerp="",
                influence=None if lay.influence is None else float(lay.influence[index]),
                activation=None)
    if index < lay.errors:
        layer, pos, feat = lay.features[index]
        node.update(node_id=f"{layer}_{feat}_{pos}", feature=feature_code(layer, feat),
                    layer=str(layer), ctx_idx=pos, feature_type=FEATURE_TYPE,
                    jsNodeId=f"{layer}_{feat}-0", clerp=str(labels.get((layer, feat), "")),
                    activation=float(lay.activations[index]))
    elif index < lay.embeddings:
        layer, pos = divmod(index - lay.errors, lay.n_pos)
        node.update(node_id=f"{layer}_-1_{pos}", feature=-1, layer=str(layer), ctx_idx=pos,
                    feature_type=ERROR_TYPE, jsNodeId=f"{layer}_-1-{pos}")
    elif index < lay.logits:
        pos = index - lay.embeddings
        token = lay.tokens[pos]
        node.update(node_id=f"E_{token}_{pos}", feature=pos, layer="E", ctx_idx=pos,
                    feature_type="embedding", jsNodeId=f"E_{token}-{pos}")
    else:
        i = index - lay.logits
        token, pos, prob = lay.logit_tokens[i], lay.n_pos - 1, float(lay.logit_probabilities[i])
        layer = str(lay.n_layers + 1)
        node.update(node_id=f"{layer}_{token}_{pos}", feature=token, layer=layer, ctx_idx=pos,
                    feature_type="logit", token_prob=prob, is_target_logit=i == lay.target_logit,
                    jsNodeId=f"L_{token}-{pos}", influence=None,
                    clerp=f'Output "{viewer_token(lay.logit_strings[i])}" (p={prob:.3f})')
    return {key: node[key] for key in NODE_FIELDS}


def _error_share(lay: _Layout) -> float | None:
    """Share of the |direct effects| into the target logit that comes from error nodes."""
    if not lay.n_logits:
        return None
    row = lay.adjacency[lay.logits + lay.target_logit].abs()
    total = float(row.sum())
    return float(row[lay.errors:lay.embeddings].sum()) / total if total > 0 else 0.0


def _version() -> str:
    try:
        return _metadata.version("attnlens")
    except _metadata.PackageNotFoundError:
        return "unknown"


# Longest slug, in UTF-8 bytes: `<slug>.json`, `<slug>.html` and the atomic writer's temp names
# beside them (`.<slug>.json.<16 hex>.attnlens-tmp`) must fit a file name (255 bytes on Linux,
# macOS and Windows file systems).
MAX_SLUG_BYTES = 200


def check_slug(slug) -> str:
    """`slug` if it can name `<slug>.json` beside the others, else a ValueError."""
    if not isinstance(slug, str) or not slug or slug.startswith(".") \
            or any(c in slug for c in "/\\\0") or (os.altsep and os.altsep in slug):
        raise ValueError(f"slug must be a non-empty file name without '/', '\\' or a leading "
                         f"'.', got {slug!r}")
    try:
        size = len(slug.encode("utf-8"))
    except UnicodeEncodeError as err:
        raise ValueError(f"slug {slug!r} has a character no file name can hold ({err.reason} "
                         f"at character {err.start})") from None
    if size > MAX_SLUG_BYTES:
        raise ValueError(f"slug is {size} bytes long; at most {MAX_SLUG_BYTES} fit a file name "
                         f"(<slug>.json and its temp file): {slug[:40]!r}...")
    if f"{slug}.json" == INDEX_FILE:
        raise ValueError(f"slug {slug!r} would overwrite the graph list {INDEX_FILE}")
    return slug


def default_slug(model_name: str, prompt, targets=None) -> str:
    """A slug for a graph of `prompt` on `model_name` (with `targets`, as given to `attribute`):
    a readable part (lower-case ASCII letters and digits of the model name and prompt, at most
    48 characters) and 10 hex digits of a SHA-256 of the exact model name, prompt and targets,
    so prompts that read alike (`import os`, `Import OS!`, any two non-ASCII prompts) never
    share a file, while the same graph asked for again replaces its old file."""
    readable = re.sub(r"[^a-z0-9]+", "-", f"{model_name}-{prompt}".lower()).strip("-")[:48]
    if isinstance(prompt, torch.Tensor):
        prompt = prompt.tolist()
    if isinstance(targets, torch.Tensor):
        targets = targets.tolist()
    if isinstance(targets, (list, tuple)):
        targets = [t.tolist() if isinstance(t, torch.Tensor) else t for t in targets]
    key = ascii((str(model_name), prompt, targets))   # ascii: surrogates hash too
    digest = hashlib.sha256(key.encode("ascii")).hexdigest()[:10]
    return f"{readable.rstrip('-') or 'graph'}-{digest}"


def check_output(directory, slug: str) -> Path:
    """Check, before a graph is computed, that `<slug>.json` can be written into `directory`
    (created if missing): ValueError naming the problem (the slug, a file where the folder
    should be, a folder that cannot be created or written). Returns the directory."""
    check_slug(slug)
    directory = Path(directory)
    try:
        if directory.exists() and not directory.is_dir():
            raise ValueError(f"output folder {directory} exists and is not a folder")
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as err:      # a name too long, a parent that is a file, no permission
        raise ValueError(f"cannot create the output folder {directory}: "
                         f"{err.strerror or err}") from None
    # a probe file as long as the longest name the writers use: a read-only folder, a full
    # disk's missing inodes or a file name limit show here, not after the graph is computed
    probe = directory / f".{slug}.json.{'0' * 16}.probe"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        pass
    except OSError as err:
        raise ValueError(f"cannot write into the output folder {directory}: "
                         f"{err.strerror or err}") from None
    probe.unlink(missing_ok=True)
    return directory


def graph_to_json(graph, slug: str, node_mask=None, edge_mask=None,
                  node_threshold: float | None = None, head_loadings=None,
                  qk=None, scan: str | None = None) -> dict:
    """The viewer's JSON of `graph` (masks: bool `[n_nodes]` and `[n_nodes n_nodes]`
    (`[target, source]`), e.g. from `attnlens.interp.attribution.prune`; None keeps every node and
    every nonzero edge). `head_loadings` (a `head_loadings.HeadLoadings` of this graph) and
    `qk` (`QKAttribution`s) add the `attention` extension (module doc) for the links kept.
    `scan` replaces `metadata.scan` (default: the model name), e.g. with the path under which
    `contexts.write_feature_pages` wrote the features' pages."""
    if scan is not None and (not isinstance(scan, str) or not scan):
        raise ValueError(f"scan must be a non-empty str, got {scan!r}")
    check_slug(slug)
    if node_threshold is not None and (isinstance(node_threshold, bool) or not (
            isinstance(node_threshold, (int, float)) and math.isfinite(node_threshold))):
        raise ValueError(f"node_threshold must be a number or None, got {node_threshold!r}")
    lay = _Layout(graph)
    n = lay.n_nodes
    node_mask = lay.mask(node_mask, (n,), "node_mask", torch.ones(n, dtype=torch.bool))
    edge_mask = lay.mask(edge_mask, (n, n), "edge_mask", torch.ones(n, n, dtype=torch.bool))
    labels = {(int(k[0]), int(k[1])): v
              for k, v in (getattr(graph, "feature_labels", None) or {}).items()}
    nodes = {i: _node(lay, i, labels) for i in node_mask.nonzero().flatten().tolist()}
    keep = edge_mask & (lay.adjacency != 0) & node_mask[:, None] & node_mask[None, :]
    targets, sources = keep.nonzero(as_tuple=True)
    weights = lay.adjacency[targets, sources].tolist()
    links = [dict(source=nodes[s]["node_id"], target=nodes[t]["node_id"], weight=float(w))
             for t, s, w in zip(targets.tolist(), sources.tolist(), weights, strict=True)]
    linked = {link["source"] for link in links} | {link["target"] for link in links}
    kept = [node for node in nodes.values()
            if node["node_id"] in linked or node["feature_type"] in ("embedding", "logit")]
    model_name = str(graph.model_name or "")
    transcoder_set = str(getattr(graph, "transcoder_set", "") or "")
    metadata = dict(slug=slug, scan=scan or model_name or "attnlens", transcoder_list=[],
                    prompt_tokens=[viewer_token(t) for t in graph.prompt_tokens],
                    prompt=graph.prompt)
    if node_threshold is not None:
        metadata["node_threshold"] = float(node_threshold)
    metadata["schema_version"] = SCHEMA_VERSION
    metadata["info"] = dict(
        description=f"attnlens attribution graph of {model_name or 'a model'}"
                    + (f" with transcoders {transcoder_set}" if transcoder_set else ""),
        generator=dict(name="attnlens", version=_version()),
        model=model_name, transcoder_set=transcoder_set, error_share=_error_share(lay))
    budget = getattr(graph, "budget", None)     # what a node budget left out (graph.budget)
    if budget is not None:
        metadata["info"]["budget"] = budget.to_json()
    q_params = dict(pinnedIds=[], supernodes=[], linkType="both", clickedId="", sg_pos="")
    data = dict(metadata=metadata, qParams=q_params, nodes=kept, links=links)
    if head_loadings is not None or qk:
        data[ATTENTION_KEY] = _attention(lay, nodes, targets, sources, head_loadings, qk or ())
    return data


def _attention(lay: _Layout, nodes: dict, targets, sources, loadings, qks) -> dict:
    """The `attention` extension: head loadings of the links kept, QK attributions."""
    from attnlens.interp.attribution.head_loadings import loadings_json, qk_json

    node_id = {i: node["node_id"] for i, node in nodes.items()}
    out = dict(schema=ATTENTION_SCHEMA)
    if loadings is not None:
        heads = tuple(loadings.heads.shape[1:])
        if heads and heads[0] != lay.n_layers:
            raise ValueError(f"head_loadings has {heads[0]} layers, the graph {lay.n_layers}")
        kept = set(zip(targets.tolist(), sources.tolist(), strict=True))
        out.update(head_kind="source head" if loadings.source_heads else "head",
                   n_heads=int(heads[1]) if len(heads) > 1 else 0,
                   loadings=loadings_json(loadings, node_id, kept))
    if qks:
        def source_id(i: int) -> str:
            return _node(lay, i, {})["node_id"]      # QK sources are in graph order
        out["qk"] = [qk_json(q, source_id) for q in qks]
    return out


def _read_index(path: Path) -> dict:
    if not path.exists():
        return {"graphs": []}
    try:
        index = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not valid JSON ({err}); it is left as it is: fix or move "
                         "it, then write the graph again") from None
    if not isinstance(index, dict) or not isinstance(index.get("graphs"), list):
        raise ValueError(f"{path} is not a graph list ({{\"graphs\": [...]}}); it is left as "
                         "it is")
    return index


@contextlib.contextmanager
def index_lock(directory: Path):
    """Hold an exclusive lock on `directory` (`fcntl.flock` on the folder itself, so no lock
    file is left beside the graphs) while its graph list is read, changed and written:
    processes writing graphs into one folder then update the list one at a time and lose no
    entry. Where fcntl is missing (Windows) the update is not locked."""
    try:
        import fcntl
    except ImportError:       # pragma: no cover - not on Linux or macOS
        yield
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)          # releases the lock


def write_graph(graph, directory, slug: str, **kw) -> Path:
    """Write `<slug>.json` into `directory` and list it in `graph-metadata.json` (other
    entries and keys kept; an entry with the same slug replaced). Both files are written
    whole to a temporary file and renamed over the old ones; the graph list is read, changed
    and written under a lock (`index_lock`), so processes writing into one folder lose no
    entry; an unreadable graph list stops the write before anything is changed. `kw` goes to
    `graph_to_json`. Returns the path."""
    data = graph_to_json(graph, slug, **kw)
    directory = check_output(directory, slug)
    index_path = directory / INDEX_FILE
    path = directory / f"{slug}.json"
    with index_lock(directory):
        index = _read_index(index_path)
        write_text_atomic(path, json.dumps(data, indent=2, ensure_ascii=False))
        entry = {k: v for k, v in data["metadata"].items() if k != "info"}
        index["graphs"] = [g for g in index["graphs"]
                           if not (isinstance(g, dict) and g.get("slug") == slug)] + [entry]
        write_text_atomic(index_path, json.dumps(index, indent=2, ensure_ascii=False))
    return path


__all__ = ["ATTENTION_KEY", "ATTENTION_SCHEMA", "ERROR_TYPE", "FEATURE_TYPE", "INDEX_FILE",
           "MAX_SLUG_BYTES", "NODE_FIELDS",
           "SCHEMA_VERSION", "check_output", "check_slug", "default_slug", "feature_code",
           "graph_to_json", "index_lock", "influence_scores", "viewer_token", "write_graph"]
