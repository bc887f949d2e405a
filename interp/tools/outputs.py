"""What the model predicts: next-token loss by position, its top-k predictions per position, and
the drop in loss when a text is seen a second time (the in-context copying that induction heads
carry).

Losses are computed from the logits in float64 (log-softmax of the model's own output), so they
do not depend on the model's loss function; `next_token_losses(...)[b, i]` is the loss of
predicting token i + 1 from positions 0..i.

Example:
    >>> losses = next_token_losses(model, model.to_tokens("the cat. the cat."))  # doctest: +SKIP
    >>> top_predictions(model, tokens, k=3).head(3)                              # doctest: +SKIP
    >>> repeat_losses(model, tokens).mean_drop                                   # doctest: +SKIP
    1.9
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch
from torch import Tensor

from attnlens.interp._common import as_tokens, check_finite, check_int, check_weights

MAX_K = 20


def next_token_logits(model, tokens, fwd_hooks=()) -> Tensor:
    """`[batch pos d_vocab]` logits (no grad), with optional extra forward hooks."""
    tokens = as_tokens(model, tokens)
    check_weights(model)
    with torch.no_grad():
        logits = model.run_with_hooks(tokens, return_type="logits", fwd_hooks=list(fwd_hooks))
    return check_finite("logits", logits)


def next_token_losses(model, tokens, fwd_hooks=()) -> Tensor:
    """`[batch pos-1]` float64 cross-entropy of each next token: entry i predicts token i + 1.

    Example:
        >>> next_token_losses(model, tokens).mean(0)     # loss by position   # doctest: +SKIP
    """
    tokens = as_tokens(model, tokens)
    if tokens.shape[1] < 2:
        raise ValueError(f"the input has {tokens.shape[1]} token(s); a next-token loss needs "
                         "at least 2")
    logp = torch.log_softmax(next_token_logits(model, tokens, fwd_hooks).double(), dim=-1)
    return -logp[:, :-1].gather(-1, tokens[:, 1:, None])[..., 0]


def top_predictions(model, tokens, k: int = 5, row: int = 0) -> pd.DataFrame:
    """The model's `k` most likely next tokens at every position of sequence `row`.

    Returns one row per (position, rank) with columns `position`, `token` (the input token
    there), `rank` (1 = most likely), `prediction` (token string), `prediction_id`, `prob`
    (float64 softmax), `next` (the true next token's string, "" at the last position) and
    `correct` (the prediction is the true next token).

    Example:
        >>> top_predictions(model, "abcabc", k=2).query("rank == 1")         # doctest: +SKIP
    """
    check_int("k", k)
    tokens = as_tokens(model, tokens)
    if not 0 <= row < tokens.shape[0]:
        raise ValueError(f"row {row!r} is outside [0, batch={tokens.shape[0]})")
    if k > min(MAX_K, model.cfg.d_vocab):
        raise ValueError(f"k={k} is over the limit: choose 1 .. {min(MAX_K, model.cfg.d_vocab)}")
    ids = tokens[row]
    probs = torch.softmax(next_token_logits(model, tokens[row:row + 1])[0].double(), dim=-1)
    top = probs.topk(k, dim=-1)
    strings = model.to_str_tokens(ids)
    rows = []
    for pos in range(len(ids)):
        nxt = int(ids[pos + 1]) if pos + 1 < len(ids) else None
        for rank in range(k):
            pid = int(top.indices[pos, rank])
            rows.append({"position": pos, "token": strings[pos], "rank": rank + 1,
                         "prediction": model.to_str_tokens(torch.tensor([pid]))[0],
                         "prediction_id": pid, "prob": float(top.values[pos, rank]),
                         "next": "" if nxt is None else strings[pos + 1],
                         "correct": nxt == pid})
    return pd.DataFrame(rows)


@dataclass
class RepeatLosses:
    """The text seen twice: `table` has one row per token of the text after its first (columns
    `offset`, `token`, `first`, `second`, `drop` = first - second, losses in nats, mean over
    the batch); `n_tokens` is the length of the repeated text, `cut_from` its length before it
    was cut to fit the context (equal when nothing was cut)."""

    table: pd.DataFrame
    n_tokens: int
    cut_from: int

    @property
    def mean_drop(self) -> float:
        return float(self.table["drop"].mean())


def repeated_input(model, tokens) -> tuple[Tensor, int, int, int]:
    """`(sequence, start, n, cut_from)`: the text of `tokens` (after a leading BOS, kept once)
    written twice, cut to the first `n` tokens so that `start + 2n <= n_ctx`."""
    tokens = as_tokens(model, tokens)
    bos = getattr(getattr(model, "tokenizer", None), "bos_token_id", None)
    start = int(bool(model.cfg.default_prepend_bos and bos is not None
                     and bool((tokens[:, 0] == bos).all())))
    body = tokens[:, start:]
    n = min(body.shape[1], (model.cfg.n_ctx - start) // 2)
    if n < 2:
        raise ValueError(f"the text has {body.shape[1]} token(s) after BOS and the context "
                         f"{model.cfg.n_ctx}: repeating it needs at least 2 tokens twice")
    seq = torch.cat([tokens[:, :start], body[:, :n], body[:, :n]], dim=1)
    return seq, start, n, body.shape[1]


def repeat_losses(model, tokens) -> RepeatLosses:
    """Loss of each token of a text the first time and the second time it is read.

    The input (a text, or `[batch pos]` ids) is written twice after one BOS (cut so that both
    copies fit the context). Token j of the text (j >= 1) is predicted once inside the first
    copy and once inside the second; a model that copies from context (induction) predicts the
    second much better, so `drop` = first - second is large and positive.

    Example:
        >>> r = repeat_losses(model, "the cat sat on the mat")              # doctest: +SKIP
        >>> r.table[["token", "first", "second", "drop"]].head()
    """
    seq, start, n, cut_from = repeated_input(model, tokens)
    losses = next_token_losses(model, seq).mean(0)       # entry i predicts token i + 1
    j = torch.arange(1, n)
    first = losses[start + j - 1]
    second = losses[start + n + j - 1]
    strings = model.to_str_tokens(seq[0, start:start + n])
    table = pd.DataFrame({"offset": j.tolist(), "token": [strings[i] for i in j.tolist()],
                          "first": first.tolist(), "second": second.tolist(),
                          "drop": (first - second).tolist()})
    return RepeatLosses(table, n, cut_from)
