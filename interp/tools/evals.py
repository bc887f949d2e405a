"""TransformerLens's `evals.induction_loss` for any vocabulary size.

TransformerLens draws the repeated random tokens from ids 100-19999, which do not exist in our
small vocabularies (the zoo's character models have a few dozen ids). `induction_loss` keeps
its definition — a batch of random sequences repeated twice, a BOS written over the first token
when prepend_bos, the mean next-token loss over the second half — and draws ids from
`[low, high)`, by default TransformerLens's [100, 20000) when the vocabulary holds it and
otherwise every id but BOS (`[1, d_vocab)` for our tokenizers).

Example:
    >>> induction_loss(zoo.load("induction-mha"), subseq_len=32)   # doctest: +SKIP
    tensor(0.1...)
"""

from __future__ import annotations

import torch
from torch import Tensor


def token_range(model) -> tuple[int, int]:
    """TransformerLens's [100, 20000) when d_vocab >= 20000, else [first non-BOS id, d_vocab)."""
    if model.cfg.d_vocab >= 20000:
        return 100, 20000
    bos = getattr(model.tokenizer, "bos_token_id", None)
    low = 1 if bos == 0 or model.tokenizer is None else 0
    return low, model.cfg.d_vocab


@torch.no_grad()
def induction_loss(model, batch_size: int = 4, subseq_len: int | None = None,
                   prepend_bos: bool | None = None, low: int | None = None,
                   high: int | None = None, seed: int | None = None) -> Tensor:
    """Mean loss on the second copy of random repeated sequences (TransformerLens's definition).

    `subseq_len` defaults to TransformerLens's 384, capped so 2 x subseq_len fits n_ctx;
    `seed` None draws from torch's global RNG as TransformerLens does (so with the same seed
    and token range both give the same number).
    """
    default_low, default_high = token_range(model)
    low = default_low if low is None else low
    high = default_high if high is None else high
    if not 0 <= low < high <= model.cfg.d_vocab:
        raise ValueError(f"token range [{low}, {high}) must lie in [0, d_vocab="
                         f"{model.cfg.d_vocab})")
    if subseq_len is None:
        subseq_len = min(384, model.cfg.n_ctx // 2)
    if not isinstance(subseq_len, int) or not 1 <= subseq_len <= model.cfg.n_ctx // 2:
        raise ValueError(f"subseq_len must be in [1, n_ctx // 2 = {model.cfg.n_ctx // 2}], got "
                         f"{subseq_len!r}")
    gen = None if seed is None else torch.Generator().manual_seed(seed)
    first = torch.randint(low, high, (batch_size, subseq_len), generator=gen)
    tokens = first.repeat(1, 2).to(model.W_E.device)
    if prepend_bos is None:
        prepend_bos = model.cfg.default_prepend_bos
    if prepend_bos:
        tokens[:, 0] = model.tokenizer.bos_token_id
    losses = model(tokens, return_type="loss", loss_per_token=True)
    return losses[:, subseq_len + 1:].mean()


__all__ = ["induction_loss", "token_range"]
