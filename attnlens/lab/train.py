"""Train a toy induction model and save it into the zoo (then its card is measured).

    python -m attnlens.lab.train mha [--steps 1500] [--attn-cfg '{"...": ...}']
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from attnlens.hooked_models.model import HookedVariantTransformer
from attnlens.hooked_models.zoo import ZOO_DIR
from attnlens.hooked_models.zoo.recipes import VARIANTS, config
from attnlens.interp.tasks.zoo_induction import sample
from attnlens.lab.evaluate import main as evaluate_main
from attnlens.training.trainer import train


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("variant", choices=sorted(VARIANTS))
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--attn-cfg", default=None, help="variant options as JSON")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    attn_cfg = json.loads(args.attn_cfg) if args.attn_cfg else None
    model = HookedVariantTransformer(config(args.variant, attn_cfg, seed=args.seed))
    t0 = time.time()
    losses = train(model, sample, steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                   seed=args.seed)
    name = f"induction-{args.variant}"
    command = "python -m attnlens.lab.train " + " ".join(argv or [args.variant])
    card = {"task": "induction: next token on the second copy of [BOS] r r, r random letters, "
                    "repeat length 6..20",
            "train_command": command, "steps": args.steps, "batch_size": args.batch_size,
            "lr": args.lr, "train_seconds": round(time.time() - t0, 1),
            "final_train_loss": round(losses[-1], 4)}
    model.save_pretrained(ZOO_DIR / name, card=card)
    evaluate_main([name, "--write"])


if __name__ == "__main__":
    main()
