"""Start a context-length-curriculum run from a shorter-context run whose steps it shares.

A recipe with `ctx_schedule=((k, 256), ...)` serves, for its first k steps, the same windows
of 256 tokens (same rows per step, same generator draws) as a run at n_ctx 256 with
`batch x n_ctx // 256` rows per step; with rotary positions (no parameter depends on n_ctx) the
model, optimiser and generator are then the same too. So the curriculum run's checkpoint at
step j <= k is the short run's checkpoint at step j, and `fork_run` writes it as such, after
checking every one of those conditions, instead of training the k steps again:

    python -m attnlens.lab.run_fork SRC_CHECKPOINT text-mha-l2-cur [--out RUNS_DIR]

The fork's card names its source (`forked_from`), and its metrics log is the source's up to
step j. tests/test_run_fork.py shows that a forked run ends bit-identical to the same recipe
trained from scratch.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import NamedTuple

from attnlens.hooked_models.checkpoint import read_config
from attnlens.lab.text_recipes import get_recipe, train_config
from attnlens.lab.text_train import default_runs_dir, schedule_phase_ends
from attnlens.training.train_state import LATEST_FILE, OPTIMIZER_FILE, STATE_FILE, read_train_state
from attnlens.training.trainer import METRICS_FILE, SCHEDULE_FUTURE, TrainConfig, same_lr_until

# train-config entries a fork may differ in: the batch (rows of the short run = batch x n_ctx /
# ctx of the curriculum) and how the schedule goes on after the fork (the lr of every step
# before it must be the same)
_MAY_DIFFER = {"batch_size", *SCHEDULE_FUTURE}


def read_card(ckpt: Path) -> dict:
    """A checkpoint's card.json ({} if it has none)."""
    path = Path(ckpt) / "card.json"
    return json.loads(path.read_text()) if path.is_file() else {}


class ForkPlan(NamedTuple):
    """What a fork writes: the run's train config and model config (dicts, as saved)."""

    train_config: dict
    model_config: dict


def check_fork(src_ckpt, recipe_name: str, seed: int = 0,
               d_vocab: int | None = None) -> ForkPlan:
    """Why `src_ckpt` is step j of recipe `recipe_name` (raises ValueError naming what is not).

    Returns the fork's train config and model config (`ForkPlan`)."""
    src_ckpt = Path(src_ckpt)
    if not (src_ckpt / STATE_FILE).is_file():
        raise ValueError(f"{src_ckpt} is not a training checkpoint (no {STATE_FILE})")
    state = read_train_state(src_ckpt)
    src_cfg = read_config(src_ckpt).to_dict()
    recipe = get_recipe(recipe_name)
    dst_cfg = recipe.config(d_vocab=d_vocab or src_cfg["d_vocab"], seed=seed).to_dict()
    # default_prepend_bos follows the tokenizer the model is built with, not the recipe
    differs = sorted(k for k in dst_cfg if k not in ("n_ctx", "metadata", "default_prepend_bos")
                     and dst_cfg[k] != src_cfg.get(k))
    if differs:
        raise ValueError(f"{src_ckpt} is another model than {recipe_name}: differs in {differs}")
    if src_cfg["positional_embedding_type"] in ("standard", "shortformer"):
        raise ValueError("learned absolute positions depend on n_ctx: a fork needs rotary or "
                         "contextual positions")
    step, short_ctx = state["step"], src_cfg["n_ctx"]
    mix = dict(recipe.data_mix or {})
    phases = schedule_phase_ends(mix.pop("ctx_schedule", ()), dst_cfg["n_ctx"])
    if not phases or phases[0][1] != short_ctx or step > phases[0][0] or mix.get("toy_schedule"):
        raise ValueError(f"{recipe_name}'s first phase must be natural text at n_ctx "
                         f"{short_ctx} for at least {step} steps; its schedule is {phases}")
    src_card = read_card(src_ckpt)
    src_mix = src_card.get("data_mix", "natural text")
    if src_card.get("ctx_schedule") or src_mix != (json.loads(json.dumps(mix)) or "natural text"):
        raise ValueError(f"{src_ckpt} was trained on {src_mix!r}, {recipe_name} on "
                         f"{mix or 'natural text'!r}")
    dst_train = train_config(recipe.train_overrides, seed=seed).to_dict()
    src_train = state["train_config"]
    differs = sorted(k for k in dst_train if k not in _MAY_DIFFER
                     and json.loads(json.dumps(dst_train[k])) != src_train.get(k))
    if differs:
        raise ValueError(f"{src_ckpt} was trained with another train config: differs in {differs}")
    rows = dst_train["batch_size"] * dst_cfg["n_ctx"] // short_ctx
    if src_train["batch_size"] != rows:
        raise ValueError(f"{src_ckpt} took {src_train['batch_size']} rows per step; "
                         f"{recipe_name}'s first phase takes {rows}")
    if not same_lr_until(TrainConfig(**src_train), TrainConfig(**dst_train), step):
        raise ValueError(f"{recipe_name}'s lr schedule differs from {src_ckpt}'s before step "
                         f"{step}")
    return ForkPlan(json.loads(json.dumps(dst_train)), dst_cfg)


def fork_run(src_ckpt, recipe_name: str, out_dir=None, seed: int = 0) -> Path:
    """Write `src_ckpt` as the first checkpoint of `out_dir/runs/recipe_name`; returns it."""
    src_ckpt = Path(src_ckpt)
    plan = check_fork(src_ckpt, recipe_name, seed=seed)
    run_dir = Path(out_dir or default_runs_dir()) / "runs" / recipe_name
    if (run_dir / LATEST_FILE).exists():
        raise ValueError(f"{run_dir} already holds a run; fork into a fresh directory")
    state = read_train_state(src_ckpt)
    ckpt = run_dir / src_ckpt.name
    ckpt.mkdir(parents=True)
    for name in ("model.safetensors", OPTIMIZER_FILE, "tokenizer.json"):
        if (src_ckpt / name).is_file():
            shutil.copyfile(src_ckpt / name, ckpt / name)
    cfg = json.loads((src_ckpt / "config.json").read_text())
    cfg.update(n_ctx=plan.model_config["n_ctx"], metadata=plan.model_config["metadata"])
    (ckpt / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True))
    card = read_card(src_ckpt)
    card.update(recipe=recipe_name, forked_from={"checkpoint": str(src_ckpt.resolve()),
                                                 "recipe": card.get("recipe"),
                                                 "step": state["step"]})
    (ckpt / "card.json").write_text(json.dumps(card, indent=2, sort_keys=True))
    state["train_config"] = plan.train_config
    (ckpt / STATE_FILE).write_text(json.dumps(state, indent=2, sort_keys=True))
    metrics = src_ckpt.parent / METRICS_FILE
    if metrics.is_file():
        kept = [ln for ln in metrics.read_text().splitlines()
                if ln.strip() and json.loads(ln)["step"] <= state["step"]]
        (run_dir / METRICS_FILE).write_text("".join(ln + "\n" for ln in kept))
    (run_dir / LATEST_FILE).write_text(ckpt.name)
    return ckpt


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="a step-N directory of the shorter-context run")
    parser.add_argument("recipe", help="the curriculum recipe that continues it")
    parser.add_argument("--out", default=None, help="runs directory (default: the zoo's)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(f"forked into {fork_run(args.checkpoint, args.recipe, args.out, seed=args.seed)}")


if __name__ == "__main__":
    main()
