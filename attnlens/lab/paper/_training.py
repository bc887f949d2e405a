"""Shared training and card writing of the paper-task zoo (every phenomenon module uses them).

`train_recipe` builds the recipe's model, runs `attnlens.training.trainer.fit` in a resumable run
directory `default_run_root()/<name>/` (`$ATTNLENS_RUNS/paper-zoo`, else
`~/.cache/attnlens/paper-zoo`: outside the work tree, so a long run resumes in a later session
on the same machine) and saves the final model with its card into the zoo directory;
`write_metrics` stores what the module's `evaluate` measures.

Example:
    >>> train_recipe(recipe, zoo_path, sample)      # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import torch

from attnlens.hooked_models.config import VariantConfig
from attnlens.hooked_models.model import HookedVariantTransformer
from attnlens.hooked_models.zoo import ZOO_DIR
from attnlens.lab.paper._registry import Recipe
from attnlens.training.train_state import runs_root
from attnlens.training.trainer import BEST_DIR, METRICS_FILE, Sampler, TrainConfig, fit

KIND = "paper-task"
# The held-out evaluation seed of every paper-task module (issue 20): fixed after the models were
# trained and never used to develop them (earlier rounds evaluated on 4321 and 98765, which the
# report's first notes were written from). Each module derives its eval batches from it
# (`EVAL_SEED + offset`, offsets < EVAL_SPAN) and cards record it; tests check it differs from
# every seed training used (`training_seeds`).
EVAL_SEED = 60_613_579
EVAL_SPAN = 100_000
WALL_FILE = "wall_seconds.json"
CLI = "python -m attnlens.lab.paper"


def default_run_root() -> Path:
    """The default parent of the paper-task runs: `runs_root()/paper-zoo`."""
    return runs_root() / "paper-zoo"


def build_model(recipe: Recipe) -> HookedVariantTransformer:
    """The untrained model of `recipe` (weights seeded by `recipe.seed`)."""
    metadata = {"task": recipe.task, "recipe": recipe.name}
    return HookedVariantTransformer(VariantConfig(**recipe.config, seed=recipe.seed,
                                                  metadata=metadata))


def device_name() -> str:
    if torch.cuda.is_available():
        return f"cuda ({torch.cuda.get_device_name(0)})"
    return f"cpu ({torch.get_num_threads()} thread{'s' * (torch.get_num_threads() > 1)})"


def train_config(recipe: Recipe) -> TrainConfig:
    train = {"checkpoint_every": max(1, recipe.train["steps"] // 5), "progress": False,
             **recipe.train}
    return TrainConfig(seed=recipe.seed, **train)


def draw_seed(gen: torch.Generator) -> int:
    """The seed of one training batch, drawn from the trainer's generator (the samplers of
    cope, mta and dcmha draw exactly one per step; `training_seeds` replays them)."""
    return int(torch.randint(0, 2**62, (1,), generator=gen))


def replay(recipe: Recipe, draw: Callable[[torch.Generator], object]) -> list:
    """What `draw` returns at every training step of `recipe`, replayed from the trainer's
    generator (`fit` seeds it with the recipe's seed and only the sampler consumes it)."""
    gen = torch.Generator().manual_seed(recipe.seed)
    return [draw(gen) for _ in range(recipe.train["steps"])]


def training_seeds(recipe: Recipe) -> set[int]:
    """Every seed training `recipe` used: the weights' seed and each batch's data seed."""
    from attnlens.lab.paper._registry import module_of

    return {recipe.seed, *module_of(recipe).batch_seeds(recipe)}


def eval_seeds(eval_seed: int = EVAL_SEED) -> range:
    """The seeds an evaluation based on `eval_seed` may draw batches from."""
    return range(eval_seed, eval_seed + EVAL_SPAN)


def _read_wall(run_dir: Path) -> float:
    path = run_dir / WALL_FILE
    return json.loads(path.read_text())["seconds"] if path.is_file() else 0.0


def run_timing(run_dir: Path, legacy_wall: float) -> dict:
    """The card's `train_seconds` (wall) and `cpu_seconds` (process CPU time) of a run.

    From the latest checkpoint's `timing`, which the trainer carries across resumes and which
    therefore counts the pieces a session's end interrupted. A run whose first checkpoints
    predate that count (`from_step` > 0) falls back on `legacy_wall`, the sum over the
    training processes that ran to their end (`WALL_FILE`: a lower bound), with no CPU time.
    """
    from attnlens.training.train_state import latest_checkpoint, load_timing

    ckpt = latest_checkpoint(run_dir)
    timing = load_timing(ckpt) if ckpt is not None else None
    if timing is None or timing.get("from_step"):
        return {"train_seconds": round(legacy_wall, 1)}
    return {"train_seconds": round(timing["wall_s"], 1), "cpu_seconds": round(timing["cpu_s"], 1)}


def train_recipe(recipe: Recipe, out_dir, sample: Sampler, resume: bool = True,
                 run_root: Path | None = None,
                 evaluate: Callable[[object], dict] | None = None) -> HookedVariantTransformer:
    """Train `recipe` on batches from `sample` and save it, with a card, into `out_dir`.

    The run directory `run_root/<name>` holds resumable checkpoints; with `resume`, an
    interrupted run continues where its last checkpoint stopped (same losses as an unbroken
    run); without it, the run starts over. Wall time accumulates across resumed pieces.
    Returns the trained model (eval mode).
    """
    run_dir = Path(run_root or default_run_root()) / recipe.name
    if not resume and run_dir.exists():
        for name in (WALL_FILE, "latest"):
            (run_dir / name).unlink(missing_ok=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    model = build_model(recipe)
    cfg = train_config(recipe)
    wall = _read_wall(run_dir)
    t0 = time.perf_counter()
    fit(model, sample, cfg, run_dir=run_dir, resume=resume, evaluate=evaluate)
    wall += time.perf_counter() - t0
    (run_dir / WALL_FILE).write_text(json.dumps({"seconds": wall}))
    curve = loss_curve(run_dir)
    final_loss = curve[-1][1] if curve else None
    steps_run, stopped = _run_end(run_dir, cfg.steps)
    card = {
        "kind": KIND, "recipe": recipe.name, "phenomenon": recipe.phenomenon,
        "variant": recipe.variant, "task": recipe.task, "task_args": recipe.task_args,
        "seed": recipe.seed, "steps": steps_run, "train": cfg.to_dict(),
        **({"stopped_early": stopped} if cfg.early_stop_patience else {}),
        **({"best_step": _best_step(run_dir)} if cfg.early_stop_keep_best else {}),
        "train_command": f"{CLI} train {recipe.name} --resume",
        **run_timing(run_dir, wall), "device": device_name(),
        "final_train_loss": final_loss, "train_loss_curve": curve,
    }
    # Every shipped model carries its tokenizer (docs/design.md contract 6): the task's vocabulary.
    from attnlens.interp.tasks.prompts import task_tokenizer

    model.tokenizer = task_tokenizer(recipe.task_args)
    # fp16 weights, as the text zoo ships: the 36 CoPE models of 4 x 128 would take 115 MB in
    # fp32, most of the zoo's cap; the card is measured on these weights (paper train evaluates
    # the saved model)
    model.save_pretrained(out_dir, card={**card, "weights_dtype": "float16"},
                          weights_dtype=torch.float16)
    return model


def answer_loss_metric(batches: list[tuple[torch.Tensor, torch.Tensor]]):
    """An early-stopping `evaluate` callback: `{"val_loss": ...}`, the mean next-token loss
    over the positions where each batch's mask `[batch pos-1]` is 1, pooled over `batches`
    (`(tokens, mask)` pairs, built once by the caller from held-out seeds)."""
    @torch.no_grad()
    def evaluate(model) -> dict:
        total = count = 0.0
        for tokens, mask in batches:
            per = model(tokens.to(model.W_E.device), return_type="loss", loss_per_token=True)
            mask = mask.to(per.device, per.dtype)
            total += float((per * mask).sum())
            count += float(mask.sum())
        return {"val_loss": round(total / count, 5)}

    return evaluate


def _best_step(run_dir: Path) -> int | None:
    """The step whose weights `early_stop_keep_best` left in the model (its best evaluation)."""
    path = Path(run_dir) / BEST_DIR / "best.json"
    return int(json.loads(path.read_text())["step"]) if path.is_file() else None


def up_to_date(recipe: Recipe, out_dir, run_root: Path | None = None) -> bool:
    """Whether `out_dir` holds `recipe`'s finished run, evaluated: its card records the step
    the run's latest checkpoint holds, the run had ended there (early stop or its ceiling) and
    the card carries metrics at `EVAL_SEED`. `train --resume` skips such a recipe instead of
    saving and evaluating it again (`eval --write` re-measures a card)."""
    from attnlens.training.train_state import latest_checkpoint, read_train_state

    card_path = Path(out_dir) / "card.json"
    run_dir = Path(run_root or default_run_root()) / recipe.name
    ckpt = latest_checkpoint(run_dir) if run_dir.is_dir() else None
    if not card_path.is_file() or ckpt is None:
        return False
    card = json.loads(card_path.read_text())
    step = read_train_state(ckpt)["step"]
    finished = card.get("stopped_early") or step == recipe.train["steps"]
    return bool(card.get("recipe") == recipe.name and card.get("steps") == step and finished
                and card.get("metrics") and card.get("eval_seed") == EVAL_SEED)


def _run_end(run_dir: Path, max_steps: int) -> tuple[int, bool]:
    """(steps the run took, whether early stopping ended it), from its metrics log."""
    log = Path(run_dir) / METRICS_FILE
    lines = [ln for ln in log.read_text().splitlines() if ln.strip()] if log.is_file() else []
    if not lines:
        return max_steps, False
    last = json.loads(lines[-1])
    return int(last["step"]), bool(last.get("early_stop", False))


def loss_curve(run_dir: Path, points: int = 20) -> list[list[float]]:
    """`[[last step, mean train loss], ...]` over `points` equal slices of the run's log."""
    log = Path(run_dir) / METRICS_FILE
    if not log.is_file():
        return []
    losses = [json.loads(line)["train_loss"] for line in log.read_text().splitlines() if line]
    size = max(1, -(-len(losses) // points))
    return [[min(i + size, len(losses)), round(sum(chunk) / len(chunk), 4)]
            for i in range(0, len(losses), size) for chunk in [losses[i:i + size]]]


def zoo_dir(name: str) -> Path:
    return ZOO_DIR / name


def staging_dir(name: str) -> Path:
    """Where `train` saves and evaluates a model before `publish` moves it into the zoo: a
    hidden sibling of its zoo directory (same file system, so the move is a rename; the zoo's
    `available` skips hidden directories), so nothing reading the zoo meanwhile sees a card
    without its metrics."""
    return ZOO_DIR / f".{name}.staging"


def publish(staging: Path, target: Path) -> None:
    """Move the finished, evaluated `staging` directory to `target` by renames: a previous
    `target` is renamed aside first and removed only once the new one is in place."""
    import shutil

    staging, target = Path(staging), Path(target)
    if not (staging / "card.json").is_file() or "metrics" not in json.loads(
            (staging / "card.json").read_text()):
        raise ValueError(f"{staging} holds no evaluated card; nothing published")
    old = target.with_name(f".{target.name}.old")
    if old.exists():
        shutil.rmtree(old)
    if target.exists():
        os.replace(target, old)
    os.replace(staging, target)
    if old.exists():
        shutil.rmtree(old)


def write_metrics(directory: Path, metrics: dict[str, float], eval_seed: int = EVAL_SEED) -> dict:
    """Store `metrics`, the eval command and the held-out `eval_seed` they were measured on in
    `directory/card.json`, atomically."""
    card_path = Path(directory) / "card.json"
    card = json.loads(card_path.read_text())
    if card.get("kind") != KIND:
        raise ValueError(f"{card_path} is not a paper-task card (kind={card.get('kind')!r})")
    card["metrics"] = metrics
    card["eval_seed"] = eval_seed
    card["eval_command"] = f"{CLI} eval {card['recipe']} --write"
    tmp = card_path.with_name(f".{card_path.name}.tmp")
    tmp.write_text(json.dumps(card, indent=2, sort_keys=True))
    os.replace(tmp, card_path)
    return card


def evaluate_model(model) -> dict[str, float]:
    """The metrics of a loaded paper-task model, measured by its recipe's module."""
    from attnlens.lab.paper._registry import get_recipe, module_of

    card = getattr(model, "card", None) or {}
    if card.get("kind") != KIND or "recipe" not in card:
        raise ValueError(f"model card is not a paper-task card: kind={card.get('kind')!r}")
    recipe = get_recipe(card["recipe"])
    with torch.no_grad():
        return module_of(recipe).evaluate(model, recipe)
