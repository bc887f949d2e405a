"""What a transcoder feature reads: its top activating contexts over a token set (e.g. a zoo
model's held-out validation windows), and loading a model's shipped transcoders.

Feature pages (`write_feature_pages`): each graph feature's top contexts written as the
per-feature JSON that circuit-tracer's graph viewer reads (its `init-feature-examples.js`),
beside the graph, so the graph opened in that viewer shows its features' examples offline.
The viewer loads a feature from `{scan}/{feature}.json` when `metadata.scan` starts with
"./" (`feature` being the node's Cantor code, `export.feature_code(layer, index)`), relative to
the viewer's page; the local server (`circuit_tracer.frontend.local_server.serve(data_dir=...)`)
serves `data_dir` under `/graph_data/`. So the pages go to
`<data_dir>/features/<name>/<code>.json` and the graph's scan is
`./graph_data/features/<name>` (`feature_scan`); pass it to `write_graph(..., scan=...)`.
One page: `{layer, index, act_min, act_max, top_logits, bottom_logits, examples_quantiles:
[{quantile_name: "Top activations", examples: [{tokens, tokens_acts_list, train_token_ind,
is_repeated_datapoint}]}]}` (the fields the viewer's example list and logit list read;
`top_logits`/`bottom_logits`: the tokens the feature's decoder direction raises and lowers
most through the unembedding, final norm left out). A scan that is a path is not a model id:
a graph written this way is for the local viewer, not for upload to Neuronpedia.

Example:
    >>> acts = feature_activations(model, transcoders[2], tokens)           # doctest: +SKIP
    >>> top_contexts(model, acts, tokens, feature=17, n=5)                  # doctest: +SKIP
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from attnlens.hooked_models.checkpoint import write_text_atomic
from attnlens.interp.sae.transcoder import Transcoder, mlp_hooks
from attnlens.interp.sae.transcoder_train import load_transcoders
from attnlens.interp.tools.text_eval import EVAL_TOKENS_FILE, load_eval_tokens

CONTEXT_WINDOW = 256   # tokens of each validation window searched for top contexts


def context_windows(directory) -> torch.Tensor | None:
    """The first CONTEXT_WINDOW tokens of the validation windows stored beside a text-zoo
    checkpoint (`eval_tokens.safetensors`), or None when there are none."""
    if not (Path(directory) / EVAL_TOKENS_FILE).is_file():
        return None
    return load_eval_tokens(directory)[:, :CONTEXT_WINDOW]


def transcoders_for(directory, dtype: torch.dtype = torch.float64) -> dict[int, Transcoder]:
    """The transcoders shipped with a checkpoint directory (`<directory>/transcoders`), in
    `dtype`. FileNotFoundError saying how to train them when there are none: with the library
    (any model; the command line's `python -m attnlens.lab.transcoders train` takes only the
    zoo's MLP models, which ship theirs, so `attnlens graph` names it only for those)."""
    path = Path(directory) / "transcoders"
    if not (path / "transcoders.safetensors").is_file():
        raise FileNotFoundError(
            f"{Path(directory).name} has no transcoders ({path / 'transcoders.safetensors'} is "
            "missing); train one per layer with attnlens.interp.sae.transcoder_train "
            f"(collect_mlp_io, train_transcoder, then save_transcoders into {path})")
    return {layer: tc.requires_grad_(False) for layer, tc in
            load_transcoders(path, dtype=dtype).items()}


@torch.no_grad()
def feature_activations(model, transcoder: Transcoder, tokens: Tensor,
                        batch_size: int = 16) -> Tensor:
    """`[batch pos d_sae]` activations of `transcoder`'s features over `tokens` `[batch pos]`."""
    hook_in = transcoder.cfg.hook_name or mlp_hooks(transcoder.cfg.layer)[0]
    layer = int(hook_in.split(".")[1])
    out = []
    for start in range(0, tokens.shape[0], batch_size):
        _, cache = model.run_with_cache(tokens[start:start + batch_size], names_filter=hook_in,
                                        stop_at_layer=layer + 1, return_cache_object=False)
        x = cache[hook_in].to(transcoder.W_enc.dtype)
        out.append(transcoder.activate(transcoder.pre_acts(x)).float())
    return torch.cat(out)


@dataclass
class Context:
    activation: float
    window: int
    position: int
    before: str
    token: str
    after: str


def top_contexts(model, activations: Tensor, tokens: Tensor, feature: int, n: int = 8,
                 left: int = 12, right: int = 3) -> list[Context]:
    """The `n` strongest activations of `feature` in `activations` `[batch pos d_sae]` (from
    `feature_activations` on `tokens`), each with `left` tokens before and `right` after."""
    if not 0 <= feature < activations.shape[-1]:
        raise ValueError(f"feature {feature} is out of range (0 .. {activations.shape[-1] - 1})")
    column = activations[..., feature]
    flat = column.flatten()
    order = flat.argsort(descending=True)[:n]
    contexts = []
    for index in order.tolist():
        value = float(flat[index])
        if value <= 0:
            break
        window, position = divmod(index, column.shape[1])
        row = tokens[window]

        def text(ids):
            if len(ids) == 0:
                return ""
            if model.tokenizer is None:
                return " ".join(f"<{int(i)}>" for i in ids)
            return "".join(model.to_str_tokens(ids))

        contexts.append(Context(activation=value, window=window, position=position,
                                before=text(row[max(0, position - left):position]),
                                token=text(row[position:position + 1]),
                                after=text(row[position + 1:position + 1 + right])))
    return contexts


FEATURES_FOLDER = "features"


def feature_scan(name: str) -> str:
    """The `metadata.scan` under which the viewer finds pages written for `name`."""
    return f"./graph_data/{FEATURES_FOLDER}/{_folder_name(name)}"


def _folder_name(name: str) -> str:
    folder = re.sub(r"[^A-Za-z0-9._-]+", "-", str(name)).strip("-.")
    if not folder:
        raise ValueError(f"feature pages need a name with a letter or digit, got {name!r}")
    return folder[:100]


def _token_texts(model, ids) -> list[str]:
    if model.tokenizer is None:
        return [f"<{int(i)}>" for i in ids]
    return [model.to_str_tokens(torch.tensor([int(i)]))[0] for i in ids]


def feature_page(model, transcoder: Transcoder, activations: Tensor, tokens: Tensor,
                 feature: int, n: int = 8, left: int = 24, right: int = 4,
                 n_logits: int = 8) -> dict:
    """One feature's page (module doc) from `activations` `[batch pos d_sae]` over `tokens`."""
    from attnlens.interp.attribution.export import viewer_token

    examples = []
    for c in top_contexts(model, activations, tokens, feature, n=n, left=left, right=right):
        start = max(0, c.position - left)
        ids = tokens[c.window, start:c.position + 1 + right]
        acts = activations[c.window, start:start + len(ids), feature]
        examples.append(dict(tokens=[viewer_token(t) for t in _token_texts(model, ids)],
                             tokens_acts_list=[float(a) for a in acts],
                             train_token_ind=c.position - start, is_repeated_datapoint=False))
    column = activations[..., feature]
    direction = transcoder.W_dec[feature].to(model.W_U.dtype) @ model.W_U     # [d_vocab]
    order = direction.argsort(descending=True)
    top, bottom = order[:n_logits].tolist(), order.flip(0)[:n_logits].tolist()
    return dict(layer=int(transcoder.cfg.layer if transcoder.cfg.layer is not None else -1),
                index=int(feature), act_min=float(column.min()), act_max=float(column.max()),
                top_logits=[viewer_token(t) for t in _token_texts(model, top)],
                bottom_logits=[viewer_token(t) for t in _token_texts(model, bottom)],
                examples_quantiles=[dict(quantile_name="Top activations", examples=examples)])


def write_feature_pages(model, transcoders: dict[int, Transcoder], graph, data_dir, name: str,
                        tokens: Tensor, node_mask=None, n: int = 8) -> tuple[str, list[Path]]:
    """Write the pages of the graph's features (those in `node_mask` when given) into
    `<data_dir>/features/<name>/` from their top contexts in `tokens` `[batch pos]` (e.g.
    `context_windows(checkpoint)`). Returns (the scan to give `write_graph`, the paths)."""
    from attnlens.interp.attribution.export import feature_code

    if not isinstance(tokens, Tensor) or tokens.ndim != 2 or tokens.numel() == 0 \
            or tokens.dtype.is_floating_point:
        raise ValueError("tokens must be a non-empty [batch, pos] tensor of token ids")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int (contexts per feature), got {n!r}")
    rows = range(graph.n_features) if node_mask is None else [
        i for i in torch.as_tensor(node_mask)[:graph.n_features].nonzero().flatten().tolist()]
    wanted: dict[int, set[int]] = {}
    for i in rows:
        layer, _, feature = graph.features[i].tolist()
        wanted.setdefault(layer, set()).add(feature)
    folder = Path(data_dir) / FEATURES_FOLDER / _folder_name(name)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for layer in sorted(wanted):
        if layer not in transcoders:
            raise ValueError(f"the graph has layer-{layer} features but no transcoder for it")
        acts = feature_activations(model, transcoders[layer], tokens)
        for feature in sorted(wanted[layer]):
            page = feature_page(model, transcoders[layer], acts, tokens, feature, n=n)
            page["layer"] = layer
            path = folder / f"{feature_code(layer, feature)}.json"
            write_text_atomic(path, json.dumps(page, ensure_ascii=False))
            paths.append(path)
    return feature_scan(name), paths


__all__ = ["CONTEXT_WINDOW", "FEATURES_FOLDER", "Context", "context_windows", "feature_activations",
           "feature_page", "feature_scan", "top_contexts", "transcoders_for",
           "write_feature_pages"]
