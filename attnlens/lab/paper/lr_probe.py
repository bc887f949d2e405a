"""Learning-rate probes of the paper-task recipes: pick a run's lr on validation data, not by hand.

    python -m attnlens.lab.paper lr-probe "dcmha-conjunction-full-*-s0" --lrs 3e-4 1e-3 3e-3 \
        --steps 2500 --csv docs/figures/reproduction/dcmha-conjunction-full_lr_probe.csv

Each recipe is trained at every lr for `steps` steps, without early stopping, with the recipe's
seed and batches (the module's `sampler`) and the lr constant after the warmup; its module's
`validation` metric (held-out batches from the module's VAL_SEED, never a training or evaluation
seed) is recorded every `eval_every` steps. `best_lrs` picks, per variant, the lr whose last
validation value is lowest; the recipes then train at that lr, and the report shows the probe
(docs/reproduction.md). Nothing is written to the zoo; the runs live in a temporary directory.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import tempfile
from pathlib import Path

import torch

from attnlens.lab.paper._registry import Recipe, modules
from attnlens.lab.paper._training import build_model, train_config
from attnlens.training.trainer import METRICS_FILE, fit

FIELDS = ("recipe", "variant", "lr", "step", "val_loss")


def probe_recipe(recipe: Recipe, lr: float, steps: int, eval_every: int = 250) -> Recipe:
    """`recipe` at learning rate `lr` for `steps` steps, evaluated every `eval_every`, no early
    stopping. The lr is held constant after the warmup: the probe stands for the first `steps`
    of a much longer run, whose cosine is still near its peak there (at 2,500 of 20,000 steps
    within 4%), not for a run that decays to 0 in `steps`."""
    if steps < eval_every:
        raise ValueError(f"steps={steps} is shorter than eval_every={eval_every}: no evaluation")
    train = {**recipe.train, "lr": lr, "steps": steps, "eval_every": eval_every,
             "min_lr_ratio": 1.0, "cooldown": 0,
             "early_stop_patience": 0, "early_stop_keep_best": False,
             "checkpoint_every": steps, "checkpoint_minutes": 0.0}
    return dataclasses.replace(recipe, name=f"{recipe.name}-lr{lr:g}", train=train)


def run_probe(recipes: list[Recipe], lrs: list[float], steps: int, eval_every: int = 250,
              progress=print) -> list[dict]:
    """Validation trajectories of every recipe at every lr: rows of `FIELDS`."""
    rows = []
    for recipe in recipes:
        module = modules()[recipe.module]
        if not hasattr(module, "validation"):
            raise ValueError(f"{recipe.name}: module {recipe.module!r} has no validation metric")
        for lr in lrs:
            run = probe_recipe(recipe, lr, steps, eval_every)
            with tempfile.TemporaryDirectory() as tmp:
                fit(build_model(run), module.sampler(run), train_config(run), run_dir=Path(tmp),
                    resume=False, evaluate=module.validation(run))
                metrics = (Path(tmp) / METRICS_FILE).read_text().splitlines()
            for line in metrics:
                row = json.loads(line)
                if "val_loss" in row:
                    rows.append(dict(recipe=recipe.name, variant=recipe.variant, lr=lr,
                                     step=row["step"], val_loss=row["val_loss"]))
            last = [r for r in rows if r["recipe"] == recipe.name and r["lr"] == lr][-1]
            progress(f"{recipe.name} lr {lr:g}: validation loss {last['val_loss']:.4f} at step "
                     f"{last['step']}")
    return rows


def write_csv(rows: list[dict], path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    return path


def read_csv(path) -> list[dict]:
    with Path(path).open(newline="") as f:
        return [dict(r, lr=float(r["lr"]), step=int(r["step"]), val_loss=float(r["val_loss"]))
                for r in csv.DictReader(f)]


def last_values(rows: list[dict]) -> dict[tuple[str, float], float]:
    """(variant, lr) -> the validation value at the probe's last step."""
    out: dict[tuple[str, float], tuple[int, float]] = {}
    for r in rows:
        key = (r["variant"], r["lr"])
        if key not in out or r["step"] >= out[key][0]:
            out[key] = (r["step"], r["val_loss"])
    return {k: v for k, (_, v) in out.items()}


def best_lrs(rows: list[dict]) -> dict[str, float]:
    """Per variant, the lr whose last validation value is lowest."""
    last = last_values(rows)
    best: dict[str, float] = {}
    for (variant, lr), value in sorted(last.items()):
        if variant not in best or value < last[(variant, best[variant])]:
            best[variant] = lr
    return best


def table(rows: list[dict], every: int = 500) -> str:
    """Markdown: validation loss per variant x lr (rows) at every `every` steps (columns)."""
    steps = sorted({r["step"] for r in rows if r["step"] % every == 0})
    keys = sorted({(r["variant"], r["lr"]) for r in rows})
    value = {(r["variant"], r["lr"], r["step"]): r["val_loss"] for r in rows}
    best = best_lrs(rows)
    lines = ["| variant | lr | " + " | ".join(f"step {s}" for s in steps) + " |",
             "|---|---|" + "---:|" * len(steps)]
    for variant, lr in keys:
        several = sum(v == variant for v, _ in keys) > 1
        mark = " (chosen)" if several and best.get(variant) == lr else ""
        cells = [f"{value[(variant, lr, s)]:.3f}" if (variant, lr, s) in value else "-"
                 for s in steps]
        lines.append(f"| {variant} | {lr:g}{mark} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(names: list[str], lrs: list[float], steps: int, csv_path, threads: int = 1) -> None:
    from attnlens.lab.paper._registry import all_recipes

    torch.set_num_threads(threads)
    recipes = [all_recipes()[n] for n in names]
    rows = run_probe(recipes, lrs, steps, progress=lambda s: print(s, flush=True))
    if csv_path:
        print(f"wrote {write_csv(rows, csv_path)}")
    print(table(rows))
    print("best lr per variant:", best_lrs(rows))
