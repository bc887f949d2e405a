"""Full QK / OV circuits of one head read over a chosen set of tokens, plain or composed.

`token_circuit(model, layer, head, ids, "qk")[i, j]` is the content score the head gives query
token `ids[i]` attending to key token `ids[j]` (`W_E QK W_E^T`, unscaled, no biases or positions);
with "ov" it is how much attending to source token `ids[i]` raises the logit of token `ids[j]`
(`W_E OV W_U`). `composed=True` uses the effective circuits of variants that mix heads
(`attnlens.interp.circuits.composed`: MTA's and DCMHA's static pre-softmax mixing for QK,
post-softmax mixing for
OV); variants without mixing give the plain circuits. Computed in float64 from the factored form,
so the vocabulary-sized matrix is never formed.

Example:
    >>> ids = circuit_token_ids(model, model.to_tokens("abcab"))         # doctest: +SKIP
    >>> token_circuit(model, 1, 2, ids, "ov").diagonal()                  # doctest: +SKIP
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformer_lens import FactoredMatrix

from attnlens.interp._common import check_head, check_int, check_layer
from attnlens.interp.circuits.composed import composed_circuits_at, composed_ov, composed_qk
from attnlens.interp.circuits.qk_ov import ov_circuit, qk_circuit

KINDS = ("qk", "ov")
MAX_TOKENS = 64


def distinct_token_ids(model, tokens) -> list[int]:
    """The distinct ids of `tokens` (`[batch pos]` or `[pos]`) in order of first appearance,
    leaving out a leading BOS; ValueError for ids outside the vocabulary or none at all."""
    ids = torch.as_tensor(tokens).reshape(-1).tolist()
    bos = getattr(getattr(model, "tokenizer", None), "bos_token_id", None)
    if ids and model.cfg.default_prepend_bos and ids[0] == bos:
        ids = ids[1:]
    out = list(dict.fromkeys(int(i) for i in ids))
    bad = [i for i in out if not 0 <= i < model.cfg.d_vocab]
    if bad:
        raise ValueError(f"token ids {bad[:5]} are outside [0, d_vocab={model.cfg.d_vocab})")
    if not out:
        raise ValueError("no tokens to show: give a text with at least one token")
    return out


def circuit_token_ids(model, tokens, limit: int = MAX_TOKENS) -> list[int]:
    """`distinct_token_ids`, ValueError when there are more than `limit`."""
    check_int("limit", limit)
    out = distinct_token_ids(model, tokens)
    if len(out) > limit:
        raise ValueError(f"the text has {len(out)} distinct tokens; the circuit view shows at "
                         f"most {limit}")
    return out


def head_circuit(model, layer: int, head: int, kind: str = "qk",
                 composed: bool = False) -> FactoredMatrix:
    """The head's `[d_model d_model]` QK or OV circuit (effective one with `composed`)."""
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r}; choose one of {list(KINDS)}")
    layer, head = check_layer(model, layer), check_head(model, head)
    if composed:
        return (composed_qk if kind == "qk" else composed_ov)(model, layer)[head]
    return (qk_circuit if kind == "qk" else ov_circuit)(model, layer, head)


def token_circuit(model, layer: int, head: int, ids: list[int], kind: str = "qk",
                  composed: bool = False, at: tuple | None = None) -> Tensor:
    """`[len(ids) len(ids)]` float64 full circuit over `ids` (rows: query / source token,
    columns: key token / output logit); see the module docstring.

    `at=(tokens, t, s)` reads the circuit composed by the mixing at query t, key s of `tokens`
    (`attnlens.interp.circuits.composed.composed_circuits_at`: DCMHA's input-dependent Compose,
    static mixing elsewhere; first sequence of the batch) instead of the static one.
    """
    if not ids:
        raise ValueError("give at least one token id")
    index = torch.as_tensor(ids, dtype=torch.long)
    if int(index.min()) < 0 or int(index.max()) >= model.cfg.d_vocab:
        raise ValueError(f"token ids must be in [0, d_vocab={model.cfg.d_vocab})")
    if at is None:
        fm = head_circuit(model, layer, head, kind, composed)
    else:
        if kind not in KINDS:
            raise ValueError(f"kind={kind!r}; choose one of {list(KINDS)}")
        tokens, t, s = at
        head = check_head(model, head)
        fm = composed_circuits_at(model, tokens, check_layer(model, layer), t, s)[kind][0, head]
    with torch.no_grad():
        W_E = model.W_E.detach().double()[index.to(model.W_E.device)]            # [n d_model]
        left = W_E @ fm.A.detach().double()                                      # [n r]
        right = fm.B.detach().double()                                           # [r d_model]
        if kind == "qk":
            return (left @ (right @ W_E.T)).cpu()
        W_U = model.W_U.detach().double()[:, index.to(model.W_U.device)]         # [d_model n]
        return (left @ (right @ W_U)).cpu()


def token_labels(model, ids: list[int]) -> list[str]:
    """Distinct axis labels of `ids`: each token's string (escaped, spaces shown as "␣"), "#id"
    added where two ids read the same."""
    strings = [repr(s)[1:-1].replace(" ", "␣")
               for s in model.to_str_tokens(torch.as_tensor(ids))]
    return [s if strings.count(s) == 1 else f"{s}#{i}" for s, i in zip(strings, ids, strict=True)]


def has_head_mixing(model) -> bool:
    """Whether any layer mixes heads statically (`attn.head_mixing()` pre or post)."""
    return any(m is not None for layer in range(model.cfg.n_layers)
               for m in model.blocks[layer].attn.head_mixing().values())
