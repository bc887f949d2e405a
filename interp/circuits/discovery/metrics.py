"""Metrics for circuit discovery: `metric(logits) -> scalar tensor`, averaged over the batch.

Example:
    >>> metric = logprob_metric(tokens, positions=range(11, 20))      # doctest: +SKIP
    >>> metric(model(tokens))                                         # doctest: +SKIP
"""

from __future__ import annotations

import torch
from torch import Tensor


def _positions(positions, n_pos: int) -> Tensor:
    pos = torch.as_tensor(list(positions), dtype=torch.long)
    if pos.numel() == 0 or int(pos.min()) < 0 or int(pos.max()) >= n_pos:
        raise ValueError(f"positions must be a non-empty subset of [0, {n_pos}), got "
                         f"{pos.tolist()}")
    return pos


def logprob_metric(targets: Tensor, positions):
    """Mean log-probability of `targets[:, p + 1]` at each position p (minus the loss there)."""
    pos = _positions(positions, targets.shape[1] - 1)
    want = targets[:, pos + 1]

    def metric(logits: Tensor) -> Tensor:
        logp = torch.log_softmax(logits[:, pos], dim=-1)
        return logp.gather(-1, want[..., None].to(logits.device)).mean()
    return metric


def loss_metric(targets: Tensor, positions):
    """Mean next-token cross-entropy at `positions` (the negative of `logprob_metric`)."""
    inner = logprob_metric(targets, positions)
    return lambda logits: -inner(logits)


def logit_diff_metric(answers: Tensor, wrong: Tensor, position: int = -1):
    """Mean logit difference `logit[answer] - logit[wrong]` at `position` (`answers`, `wrong`
    `[batch]` token ids)."""
    def metric(logits: Tensor) -> Tensor:
        row = logits[:, position]
        a = row.gather(-1, answers[:, None].to(row.device))
        b = row.gather(-1, wrong[:, None].to(row.device))
        return (a - b).mean()
    return metric
