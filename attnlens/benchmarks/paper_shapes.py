"""CPU cost of the paper-task zoo's CoPE recipes at candidate shapes (issue 24, item 1).

    python -m attnlens.benchmarks.paper_shapes                       # documented sizes
    python -m attnlens.benchmarks.paper_shapes --shapes 4x256 4x128 --steps 20

For each task (Flip-Flop, counting with 3 variables) x positional scheme x shape `LxD`
(L layers, d_model D, heads of 32, MLP 4D), it times eager training steps of the recipe's own
batches (forward, masked answer loss, backward, AdamW; one thread) in CPU-seconds of this
process, which the other jobs of a shared machine barely move, and prints CPU-s per step, tokens
per CPU-second, the model's size in fp16 and the size of the whole -long group (every task x
scheme x seed) at that shape. The shape the recipes use is chosen from this table: a run must
end in one session (runs do not survive a machine that is not handed back) and the zoo must stay
under its size cap.
"""

from __future__ import annotations

import argparse
import time

import torch

from attnlens.lab.paper import cope
from attnlens.lab.paper._training import build_model
from attnlens.training.trainer import masked_next_token_loss

SHAPES = ("4x256", "4x128", "3x128")
TASKS = ("flipflop", "counting-3var")   # counting with 5 variables costs as 3


def shape_config(shape: str) -> dict:
    """`"4x128"` -> the model-config keys of 4 layers, d_model 128, heads of 32, MLP 4 x 128."""
    layers, d_model = (int(x) for x in shape.lower().split("x"))
    if d_model % 32:
        raise ValueError(f"shape {shape!r}: d_model must be a multiple of the head size 32")
    return dict(n_layers=layers, d_model=d_model, d_head=32, n_heads=d_model // 32,
                d_mlp=4 * d_model)


def group_size() -> int:
    """How many -long CoPE recipes there are (every task x scheme x seed)."""
    return sum(1 for r in cope.RECIPES.values() if r.phenomenon.endswith("-long"))


def time_steps(recipe, steps: int, warmup: int = 2) -> tuple[float, float]:
    """(CPU-seconds per training step, tokens per step) of eager steps of `recipe`."""
    model = build_model(recipe).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    sample = cope.sampler(recipe)
    gen = torch.Generator().manual_seed(0)
    batch = recipe.train["batch_size"]
    spent = tokens = 0.0
    for i in range(warmup + steps):
        toks, mask = sample(batch, gen)
        t0 = time.process_time()
        loss = masked_next_token_loss(model, toks, mask)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if i >= warmup:
            spent += time.process_time() - t0
            tokens += toks.numel()
    return spent / steps, tokens / steps


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES))
    parser.add_argument("--positions", nargs="+", default=list(cope.POSITIONS))
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=TASKS)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    n_group = group_size()
    print(f"CoPE -long recipes, eager training steps, batch 32, 1 thread "
          f"({time.strftime('%Y-%m-%d')}, torch {torch.__version__}); group = {n_group} runs\n")
    print("| task | scheme | shape | params | fp16 MB | group MB | CPU-s / step "
          "| tokens / CPU-s |")
    print("|---|---|---|---|---|---|---|---|")
    for task in args.tasks:
        for position in args.positions:
            name = f"cope-{task}-{position}-long-s0"
            base = cope.RECIPES[name]
            for shape in args.shapes:
                recipe = type(base)(**{**base.__dict__,
                                       "config": {**base.config, **shape_config(shape)}})
                n_params = sum(p.numel() for p in build_model(recipe).parameters())
                mb = 2 * n_params / 2**20
                per_step, tokens = time_steps(recipe, args.steps)
                print(f"| {task} | {position} | {shape} | {n_params:,} | {mb:.2f} "
                      f"| {mb * n_group:.0f} | {per_step:.3f} | {tokens / per_step:,.0f} |",
                      flush=True)


if __name__ == "__main__":
    main()
