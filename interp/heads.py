"""Vectorised head detectors over `[batch head_index query_pos key_pos]` maps of any stage.

Each score follows TransformerLens's `detect_head(..., error_measure="mul")`: the fraction of a
head's attention mass that falls on the detection pattern's (query, key) pairs, averaged over the
batch. They accept any map of the stage catalogue, not only hook_pattern.

Example:
    >>> pattern = torch.eye(5)[None, None].repeat(1, 2, 1, 1)  # attends to itself
    >>> previous_token_scores(pattern)
    tensor([0., 0.])
"""

from __future__ import annotations

import torch
from jaxtyping import Float, Int
from torch import Tensor


def _mass_on(pattern: Tensor, detection: Tensor) -> Tensor:
    """Fraction of each head's mass on `detection` (`[batch q k]` or `[q k]`), mean over batch."""
    if detection.ndim == 2:
        detection = detection[None]
    detection = detection[:, None].to(pattern.dtype)
    on = (pattern * detection).sum((-2, -1))
    total = pattern.sum((-2, -1)).clamp(min=torch.finfo(pattern.dtype).tiny)
    return (on / total).mean(0)


def previous_token_scores(pattern: Float[Tensor, "batch head_index query_pos key_pos"]) -> Tensor:
    """`[head_index]` fraction of attention on the previous token (the sub-diagonal)."""
    T = pattern.shape[-1]
    return _mass_on(pattern, torch.diag(torch.ones(T - 1), -1))


def duplicate_token_detection(tokens: Int[Tensor, "batch pos"]) -> Tensor:
    """`[batch q k]` 1 where key k < q holds the same token as query q (TL's detection pattern)."""
    same = tokens[:, :, None] == tokens[:, None, :]
    return torch.tril(same, diagonal=-1).float()


def induction_detection(tokens: Int[Tensor, "batch pos"]) -> Tensor:
    """`[batch q k]` 1 where key k follows an earlier occurrence of query q's token.

    The duplicate-token mask shifted right by one key (TL's `induction_head` pattern).
    """
    dup = duplicate_token_detection(tokens)
    shifted = torch.zeros_like(dup)
    shifted[:, :, 1:] = dup[:, :, :-1]
    return torch.tril(shifted, diagonal=-1)


def duplicate_token_scores(pattern: Tensor, tokens: Tensor) -> Tensor:
    """`[head_index]` fraction of attention on earlier copies of the current token."""
    return _mass_on(pattern, duplicate_token_detection(tokens.to(pattern.device)))


def induction_scores(pattern: Tensor, tokens: Tensor) -> Tensor:
    """`[head_index]` fraction of attention on tokens that followed earlier copies (any input)."""
    return _mass_on(pattern, induction_detection(tokens.to(pattern.device)))


def repeated_induction_scores(pattern: Tensor, half_len: int, bos: bool = True) -> Tensor:
    """`[head_index]` mean attention on the induction stripe of `[BOS] r r` inputs.

    Query i of the second copy attends to key i - half_len + 1 (the token after its earlier copy).
    """
    start = int(bos) + half_len
    q = torch.arange(start, pattern.shape[-2])
    k = q - half_len + 1
    return pattern[..., q, k].mean((0, -1))
