"""The toy induction task of the `induction-*` models: batches and held-out metrics.

The architecture (`attnlens.hooked_models.zoo.recipes.config`) stays with the checkpoints; the task
data comes from `attnlens.interp.tasks.induction`, so this file sits on the floor that may import
both.
"""

from __future__ import annotations

import torch

from attnlens.hooked_models.zoo.recipes import ALPHABET, MAX_HALF, MIN_HALF
from attnlens.interp.tasks.induction import repeated_tokens, second_half_loss_mask

EVAL_SEED = 1234


def sample(batch: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of `[BOS] r r` with one random repeat length, and its second-copy loss mask."""
    n = int(torch.randint(MIN_HALF, MAX_HALF + 1, (1,), generator=gen))
    return (repeated_tokens(batch, n, len(ALPHABET) + 1, generator=gen),
            second_half_loss_mask(batch, n))


@torch.no_grad()
def induction_metrics(model, per_length: int = 256, seed: int = EVAL_SEED) -> dict[str, float]:
    """Second-copy loss and accuracy averaged over repeat lengths MIN_HALF..MAX_HALF.

    Held-out seed 1234, 256 sequences per repeat length 6..20.
    """
    gen = torch.Generator().manual_seed(seed)
    losses, correct, count = [], 0, 0
    for n in range(MIN_HALF, MAX_HALF + 1):
        tokens = repeated_tokens(per_length, n, len(ALPHABET) + 1, generator=gen)
        mask = second_half_loss_mask(per_length, n).bool()
        logits = model(tokens)
        per_tok = model.loss_fn(logits, tokens, per_token=True)
        losses.append(per_tok[mask].mean().item())
        pred = logits[:, :-1].argmax(-1)
        correct += (pred == tokens[:, 1:])[mask].sum().item()
        count += mask.sum().item()
    return {"second_copy_loss": round(sum(losses) / len(losses), 4),
            "second_copy_accuracy": round(correct / count, 4)}
