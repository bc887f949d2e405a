"""A small, honest training loop for toy models (AdamW, cosine decay, progress bar).

Example:
    >>> from interp.tasks.induction import repeated_tokens
    >>> losses = train(model, lambda b, g: (repeated_tokens(b, 8, 50, seed=None), None),
    ...                steps=10)                                  # doctest: +SKIP
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from tqdm.auto import tqdm

Batch = tuple[torch.Tensor, torch.Tensor | None]


def masked_next_token_loss(model, tokens: torch.Tensor, loss_mask: torch.Tensor | None):
    """Mean next-token loss over positions where `loss_mask` `[batch pos-1]` is 1 (all if None)."""
    per_token = model(tokens, return_type="loss", loss_per_token=True)
    if loss_mask is None:
        return per_token.mean()
    if loss_mask.shape != per_token.shape:
        raise ValueError(f"loss_mask must be [batch, pos-1] = {tuple(per_token.shape)}, "
                         f"got {tuple(loss_mask.shape)}")
    mask = loss_mask.to(per_token.device, per_token.dtype)
    return (per_token * mask).sum() / mask.sum().clamp(min=1)


def train(model, sample: Callable[[int, torch.Generator], Batch], steps: int,
          batch_size: int = 32, lr: float = 1e-3, weight_decay: float = 0.01,
          warmup: int = 20, seed: int = 0, progress: bool = True) -> list[float]:
    """Train `model` on batches from `sample(batch_size, generator)`; returns the loss per step."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    model.train()
    losses = []
    bar = tqdm(range(steps), disable=not progress, desc="train", leave=False)
    for _ in bar:
        tokens, mask = sample(batch_size, gen)
        loss = masked_next_token_loss(model, tokens.to(model.cfg.device), mask)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
    model.eval()
    return losses
