"""Repeated random tokens: the standard induction-head probe (Olsson et al. 2022).

`repeated_tokens(batch, half_len, vocab)` returns `[BOS] r r` with `r` uniform over the vocabulary
(excluding BOS), so an induction head at position i of the second copy attends to i - half_len + 1.

Example:
    >>> toks = repeated_tokens(2, 5, d_vocab=20, seed=0)
    >>> toks.shape, bool((toks[:, 1:6] == toks[:, 6:]).all())
    (torch.Size([2, 11]), True)
"""

from __future__ import annotations

import torch


def repeated_tokens(batch: int, half_len: int, d_vocab: int, bos: int | None = 0,
                    seed: int | None = None,
                    generator: torch.Generator | None = None) -> torch.Tensor:
    """`[batch, (1 if bos is not None) + 2 * half_len]` token ids: [BOS] + r + r.

    Randomness comes from `generator` if given, else from a fresh one seeded with `seed`.
    """
    if half_len < 1 or batch < 1:
        raise ValueError(f"batch and half_len must be >= 1, got {batch}, {half_len}")
    low = 1 if bos == 0 else 0
    if d_vocab - low < 2:
        raise ValueError(f"d_vocab={d_vocab} is too small for random tokens")
    gen = generator
    if gen is None and seed is not None:
        gen = torch.Generator().manual_seed(seed)
    r = torch.randint(low, d_vocab, (batch, half_len), generator=gen)
    parts = [r, r]
    if bos is not None:
        parts.insert(0, torch.full((batch, 1), bos, dtype=torch.long))
    return torch.cat(parts, dim=1)


def second_half_loss_mask(batch: int, half_len: int, bos: bool = True) -> torch.Tensor:
    """`[batch, pos-1]` mask selecting next-token predictions inside the second copy."""
    T = int(bos) + 2 * half_len
    mask = torch.zeros(batch, T - 1)
    mask[:, int(bos) + half_len:] = 1
    return mask
