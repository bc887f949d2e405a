"""Evaluate a bundled model on its task; `--write` stores the metrics in its card.json.

    python -m hooked_models.zoo.evaluate induction-mha [--write]

Metrics (held-out seed 1234, 256 sequences per repeat length 6..20): mean next-token loss and
accuracy on the second copy of repeated random letters.
"""

from __future__ import annotations

import argparse
import json

import torch

from hooked_models.zoo import available, load, path
from hooked_models.zoo.recipes import ALPHABET, MAX_HALF, MIN_HALF
from interp.tasks.induction import repeated_tokens, second_half_loss_mask

EVAL_SEED = 1234


@torch.no_grad()
def induction_metrics(model, per_length: int = 256, seed: int = EVAL_SEED) -> dict[str, float]:
    """Second-copy loss and accuracy averaged over repeat lengths MIN_HALF..MAX_HALF."""
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


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("name", choices=available())
    parser.add_argument("--write", action="store_true", help="store the metrics in card.json")
    args = parser.parse_args(argv)
    model = load(args.name)
    metrics = induction_metrics(model)
    print(json.dumps(metrics, indent=2))
    if args.write:
        card_path = path(args.name) / "card.json"
        card = json.loads(card_path.read_text())
        card["metrics"] = metrics
        card["eval_command"] = f"python -m hooked_models.zoo.evaluate {args.name} --write"
        card_path.write_text(json.dumps(card, indent=2, sort_keys=True))


if __name__ == "__main__":
    main()
