"""What a transcoder feature reads: its top activating contexts over a token set (e.g. a zoo
model's held-out validation windows), and loading a model's shipped transcoders.

Example:
    >>> acts = feature_activations(model, transcoders[2], tokens)           # doctest: +SKIP
    >>> top_contexts(model, acts, tokens, feature=17, n=5)                  # doctest: +SKIP
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

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


__all__ = ["CONTEXT_WINDOW", "Context", "context_windows", "feature_activations", "top_contexts",
           "transcoders_for"]
