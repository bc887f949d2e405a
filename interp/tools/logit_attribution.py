"""Direct logit attribution per head: how much each head's output, read straight through the
unembedding, raises the logit of a token at one position.

A head's direct contribution at position p is its result `z[p, h] @ W_O[h]`, scaled by the final
LayerNorm as the residual stream is (frozen scale, TransformerLens's `apply_ln_to_stack`) and
projected onto the unembedding direction of the target token (minus the mean over `against`
tokens, when given: a logit difference). TransformerLens computes it
(`ActivationCache.stack_head_results` + `logit_attrs`), which runs on every attnlens variant
because `hook_z` is what multiplies `W_O` for each of them (docs/design.md contract 4). The
contributions leave out the paths through later layers (indirect effects) and MLPs.

Example:
    >>> table = head_logit_attribution(model, tokens, position=-1)   # doctest: +SKIP
    >>> table.sort_values("attribution").tail(3)[["head_label", "attribution"]]
"""

from __future__ import annotations

import pandas as pd
import torch

from attnlens.interp._common import as_tokens


def head_logit_attribution(model, tokens, position: int = -1, target: int | None = None,
                           against: list[int] | None = None) -> pd.DataFrame:
    """One row per head: `head_label`, `layer`, `head`, `attribution` (logits, mean over the
    batch), and the `position`, `target` id and `target_str` it is measured for.

    Args:
        tokens: `[batch pos]` ids (or text, tokenised by the model).
        position: the position whose prediction is explained (negative counts from the end).
        target: the token id whose logit is attributed; default the model's top prediction
            at `position` on the first prompt.
        against: token ids whose mean logit is subtracted (attribution to a logit difference).
    """
    tokens = as_tokens(model, tokens)
    n = tokens.shape[1]
    if not isinstance(position, int) or isinstance(position, bool) or not -n <= position < n:
        raise ValueError(f"position {position!r} is outside the prompt: choose {-n} .. {n - 1}")
    position = position % n
    vocab = model.cfg.d_vocab
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens)
        if target is None:
            target = int(logits[0, position].argmax())
        for t in [target, *(against or [])]:
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab:
                raise ValueError(f"token id {t!r} is outside the vocabulary [0, {vocab})")
        stack, labels = cache.stack_head_results(layer=-1, pos_slice=position,
                                                 return_labels=True)
        batch = tokens.shape[0]

        def attribution(token: int) -> torch.Tensor:
            ids = torch.full((batch,), token, dtype=torch.long, device=tokens.device)
            return cache.logit_attrs(stack, tokens=ids, pos_slice=position)

        attrs = attribution(target)
        if against:
            attrs = attrs - torch.stack([attribution(t) for t in against]).mean(0)
    values = attrs.reshape(len(labels), -1).mean(-1).double()
    rows = []
    for label, value in zip(labels, values.tolist(), strict=True):
        layer, head = (int(x) for x in label[1:].split("H"))
        rows.append({"head_label": label, "layer": layer, "head": head, "attribution": value})
    table = pd.DataFrame(rows)
    text = model.to_string(torch.tensor([target])) if model.tokenizer is not None else ""
    return table.assign(position=position, target=target, target_str=text)


__all__ = ["head_logit_attribution"]
