"""A training loop fit for real runs, and the small `train` API the toy recipes use.

`fit` runs AdamW with per-parameter groups (no weight decay on norms, biases and embeddings;
attention gates, declared by an attention class's `gate_parameter_names`, get their own learning
rate and no decay), linear warmup + cosine decay, gradient clipping, bf16 autocast on CUDA,
periodic evaluation, a tqdm bar with loss and tokens/s, a JSON-lines metrics log, and
checkpoints that resume exactly: a resumed run reproduces the uninterrupted run's losses.

The loop knows nothing about tasks or analyses: batches come from `sample(batch_size, generator)`
and evaluations from an `evaluate(model) -> dict` callback (the zoo recipes, one floor up in
`attnlens.lab`, pass validation loss and an induction score there).

Example:
    >>> losses = fit(model, sample, TrainConfig(steps=100), run_dir="out/run")  # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm.auto import tqdm

from attnlens.training.stop_signals import StopSignals, TrainingStopped
from attnlens.training.train_state import (
    latest_checkpoint,
    load_timing,
    load_train_state,
    read_train_state,
    rewind_metrics,
    save_train_state,
)

BEST_DIR = "best"   # early_stop_keep_best's weights, in the run directory
Batch = tuple[torch.Tensor, torch.Tensor | None]
Sampler = Callable[[int, torch.Generator], Batch]
METRICS_FILE = "metrics.jsonl"
EMBEDDING_PARAMS = ("embed.W_E", "pos_embed.W_pos")


@dataclass
class TrainConfig:
    """Optimisation settings of one run (recorded in the checkpoint and the card).

    Attributes:
        steps: optimizer steps in the whole run (the cosine reaches its floor at the last one).
        batch_size: sequences per step.
        lr: peak learning rate; `min_lr_ratio` * lr is the floor of the cosine.
        warmup: linear warmup steps.
        weight_decay, betas: AdamW's (decay only on matrices that are not embeddings).
        gate_lr: learning rate of gate parameters (None: `lr`); they are never decayed.
        grad_clip: max global gradient norm (0: off).
        seed: seeds the batch generator and torch's global RNG.
        eval_every: run `evaluate` every N steps and at the end (0: only at the end).
        checkpoint_every: save a resumable checkpoint every N steps and at the end (0: only at
            the end; needs a run directory).
        checkpoint_minutes: also save one whenever this many minutes of wall time have passed
            since the last save (0: off), so a slow run on a shared CPU loses little when it is
            stopped. Where a checkpoint falls does not change the run: resuming from any step
            reproduces the uninterrupted losses.
        bf16: autocast to bfloat16 on CUDA (ignored on the CPU, which trains in the model dtype).
        early_stop_patience: stop once this many evaluations in a row have not lowered
            `early_stop_metric` (a key of `evaluate`'s dict, lower is better, e.g. a held-out
            split's loss) by more than `early_stop_min_delta` below its best (0: off; needs
            `evaluate` and `eval_every`). `steps` is then the most the run may take. The last
            metrics record of a stopped run says `"early_stop": true`; a resumed run rebuilds
            the count from the metrics log, so it stops where an unbroken run would.
        early_stop_keep_best: with early stopping, the model `fit` leaves is the one of the best
            evaluation, not the last (whose metric is up to `early_stop_patience` evaluations
            worse). Its weights are kept whenever the metric improves, in `run_dir/best/`
            (with the step, `best/best.json`) or in memory without a run directory.
        cooldown: the last `cooldown` steps scale the lr down linearly towards 0 (a
            warmup-stable-decay schedule, Hagele et al. 2024, with `min_lr_ratio` 1: a constant
            lr, then the decay; 0: off). A run may be resumed with another `steps` or
            `cooldown` as long as the lr of every step it has run is unchanged, so the decay
            can be decided when the stable phase has done its work.
        compile: run the training forward through `torch.compile` (the model itself stays
            eager: evaluations, hooks and checkpoints see the same parameters). With nothing
            observed every variant's block is one graph; the first steps pay the compile.
    """

    steps: int
    batch_size: int = 32
    lr: float = 1e-3
    min_lr_ratio: float = 0.0
    warmup: int = 20
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    gate_lr: float | None = None
    grad_clip: float = 1.0
    seed: int = 0
    eval_every: int = 0
    checkpoint_every: int = 0
    checkpoint_minutes: float = 0.0
    bf16: bool = True
    compile: bool = False
    early_stop_patience: int = 0
    early_stop_metric: str = "val_loss"
    early_stop_min_delta: float = 0.0
    early_stop_keep_best: bool = False
    cooldown: int = 0
    progress: bool = True

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("warmup", "eval_every", "checkpoint_every", "checkpoint_minutes",
                     "early_stop_patience", "early_stop_min_delta", "cooldown"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.lr <= 0 or (self.gate_lr is not None and self.gate_lr <= 0):
            raise ValueError(f"lr and gate_lr must be > 0, got {self.lr}, {self.gate_lr}")
        self.betas = tuple(self.betas)

    def to_dict(self) -> dict:
        """The settings that define the run (resume checks them): not progress bars or when
        checkpoints are written."""
        out = {k: v for k, v in dataclasses.asdict(self).items()
               if k not in ("progress", "checkpoint_minutes")}
        if not self.early_stop_patience:   # off: runs from before the option resume unchanged
            for k in ("early_stop_patience", "early_stop_metric", "early_stop_min_delta"):
                out.pop(k)
        if not (self.early_stop_patience and self.early_stop_keep_best):
            out.pop("early_stop_keep_best")
        if not self.cooldown:
            out.pop("cooldown")
        return out


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Multiplier of the peak lr at 0-based `step`: warmup (step+1)/warmup, then cosine, and
    over the last `cooldown` steps a linear decay of that towards 0."""
    if step < cfg.warmup:
        factor = (step + 1) / cfg.warmup
    else:
        progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
        cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
        factor = cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * cosine
    if cfg.cooldown and step >= cfg.steps - cfg.cooldown:
        factor *= (cfg.steps - step) / (cfg.cooldown + 1)
    return factor


# Train-config entries a resumed run may change when the lr of every step already run stays the
# same: how long the run goes on and how its lr ends.
SCHEDULE_FUTURE = ("steps", "cooldown")


def resume_check_config(saved: dict, cfg: TrainConfig, step: int) -> dict:
    """What `load_train_state` checks a checkpoint at `step` (train config `saved`) against.

    `cfg`'s own settings, unless the two differ only in SCHEDULE_FUTURE and agree on the lr of
    every step already run (0..step-1): the run so far is then the run `cfg` describes, and
    the saved settings are accepted (the next checkpoint records `cfg`'s)."""
    mine = json.loads(json.dumps(cfg.to_dict()))
    differs = {k for k in set(saved) | set(mine) if saved.get(k) != mine.get(k)}
    if not differs or not differs <= set(SCHEDULE_FUTURE):
        return mine
    if step > cfg.steps or not same_lr_until(TrainConfig(**saved), cfg, step):
        return mine
    return saved


def same_lr_until(a: TrainConfig, b: TrainConfig, step: int) -> bool:
    """Whether schedules `a` and `b` give every step before `step` the same lr factor."""
    return all(lr_factor(s, a) == lr_factor(s, b) for s in range(step))


class EarlyStop:
    """The early-stopping count of `fit`: evaluations since the best `metric` value."""

    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg
        self.best = math.inf
        self.since_best = 0
        self.improved = False   # whether the last `update` lowered the best value

    def update(self, record: dict) -> bool:
        """Take one evaluation's record; True when the run should stop after it."""
        cfg = self.cfg
        self.improved = False
        if not cfg.early_stop_patience or cfg.early_stop_metric not in record:
            return False
        value = float(record[cfg.early_stop_metric])
        if value < self.best - cfg.early_stop_min_delta:
            self.best, self.since_best, self.improved = value, 0, True
        else:
            self.since_best += 1
        return self.since_best >= cfg.early_stop_patience

    def replay(self, metrics_path: Path) -> bool:
        """Rebuild the count from a (rewound) metrics log; True if that run had stopped."""
        stopped = False
        if metrics_path.is_file():
            for line in metrics_path.read_text().splitlines():
                if line.strip():
                    stopped = self.update(json.loads(line))
        return stopped


def compiled_forward(model):
    """`torch.compile(model)` for training steps of one fixed shape (a static graph).

    The model's token range check syncs on the token values; it is moved out of the graph
    (`torch.compiler.disable`) so the whole forward compiles without a graph-break warning. The
    model itself stays eager: evaluations, hooks and checkpoints use it as before.
    """
    if "_check_tokens" not in vars(model):
        model._check_tokens = torch.compiler.disable(model._check_tokens)
    return torch.compile(model, dynamic=False)


def gate_parameter_names(model) -> set[str]:
    """Full names of the parameters that attention classes declare as gates."""
    names = set()
    for prefix, module in model.named_modules():
        for local in getattr(module, "gate_parameter_names", ()):
            names.add(f"{prefix}.{local}" if prefix else local)
    return names


def param_groups(model, cfg: TrainConfig) -> list[dict]:
    """AdamW groups "decay", "no_decay" (norms, biases, embeddings) and "gates" (own lr)."""
    gates = gate_parameter_names(model)
    groups = {"decay": [], "no_decay": [], "gates": []}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if name in gates:
            groups["gates"].append(p)
        # TransformerLens names every bias b_* (b_Q is [head_index d_head], so ndim alone
        # would miss it); vectors are norm weights and gates.
        elif p.ndim < 2 or name.rsplit(".", 1)[-1].startswith("b_") \
                or name in EMBEDDING_PARAMS:
            groups["no_decay"].append(p)
        else:
            groups["decay"].append(p)
    settings = {"decay": (cfg.lr, cfg.weight_decay), "no_decay": (cfg.lr, 0.0),
                "gates": (cfg.gate_lr or cfg.lr, 0.0)}
    return [{"params": ps, "name": g, "base_lr": settings[g][0], "lr": settings[g][0],
             "weight_decay": settings[g][1]} for g, ps in groups.items() if ps]


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



class BestWeights:
    """`early_stop_keep_best`'s store: the weights of the best evaluation so far, in
    `run_dir/best/` (safetensors, written atomically, with `best.json`) or in memory."""

    def __init__(self, run_dir: Path | None):
        self.dir = None if run_dir is None else run_dir / BEST_DIR
        self.state: dict | None = None

    def keep(self, model, step: int, value: float) -> None:
        if self.dir is None:
            self.state = {k: v.detach().clone() for k, v in model.state_dict().items()}
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.dir / ".model.safetensors.tmp"
        save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()}, tmp)
        os.replace(tmp, self.dir / "model.safetensors")
        _atomic_json(self.dir / "best.json", {"step": step, "value": value})

    def restore(self, model) -> int | None:
        """Load the kept weights into `model`; the step they are from (None: nothing kept)."""
        if self.dir is None:
            if self.state is not None:
                model.load_state_dict(self.state)
            return None
        if not (self.dir / "best.json").is_file():
            return None
        model.load_state_dict(load_file(self.dir / "model.safetensors",
                                        device=str(next(model.parameters()).device)))
        return int(json.loads((self.dir / "best.json").read_text())["step"])


def _atomic_json(path: Path, obj: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, sort_keys=True))
    os.replace(tmp, path)


def _append_jsonl(path: Path, record: dict) -> None:
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")


def fit(model, sample: Sampler, cfg: TrainConfig, run_dir=None, resume: bool = True,
        evaluate: Callable[[object], dict] | None = None, card: dict | None = None) -> list[float]:
    """Train `model` in place for `cfg.steps` steps; returns the train loss of each step run now.

    With `run_dir`, metrics go to `run_dir/metrics.jsonl` and checkpoints to `run_dir/step-N/`
    (`latest` names the newest); with `resume`, a run directory that holds a checkpoint is
    continued from it (weights, optimizer, schedule position, batch generator, metrics log).
    With `run_dir`, SIGTERM, SIGHUP (unless ignored, as under nohup) or Ctrl-C ends the current
    step, checkpoints it and raises `TrainingStopped` (attnlens.training.stop_signals): calling
    `fit` again resumes from that step.
    """
    run_dir = None if run_dir is None else Path(run_dir)
    if cfg.checkpoint_every and run_dir is None:
        raise ValueError("checkpoint_every needs a run_dir to write checkpoints into")
    if cfg.early_stop_patience and (evaluate is None or not cfg.eval_every):
        raise ValueError("early_stop_patience needs an evaluate callback and eval_every > 0")
    early = EarlyStop(cfg)
    best = BestWeights(run_dir) if cfg.early_stop_patience and cfg.early_stop_keep_best else None
    device = torch.device(model.cfg.device)
    torch.manual_seed(cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed)
    opt = torch.optim.AdamW(param_groups(model, cfg), lr=cfg.lr, betas=cfg.betas,
                            weight_decay=cfg.weight_decay)
    start, tokens_seen = 0, 0
    timing = {"wall_s": 0.0, "cpu_s": 0.0, "from_step": 0}
    if run_dir is not None:
        run_dir.mkdir(parents=True, exist_ok=True)
        ckpt = latest_checkpoint(run_dir) if resume else None
        if ckpt is not None:
            saved = read_train_state(ckpt)
            start, tokens_seen = load_train_state(
                ckpt, model, opt, gen,
                resume_check_config(saved["train_config"], cfg, saved["step"]))
            # A checkpoint from before timing was kept: count from here, and say so.
            timing = load_timing(ckpt) or {**timing, "from_step": start}
        rewind_metrics(run_dir / METRICS_FILE, start)
        if early.replay(run_dir / METRICS_FILE):
            if best is not None:
                best.restore(model)
            model.eval()
            return []
    if start >= cfg.steps:
        if best is not None:
            best.restore(model)
        model.eval()
        return []
    use_bf16 = cfg.bf16 and device.type == "cuda"
    # Shapes are fixed for a run: a static graph, compiled once (recompiled only if a guard,
    # e.g. a hook left attached by an evaluation, changes).
    forward = compiled_forward(model) if cfg.compile else model
    model.train()
    losses: list[float] = []
    bar = tqdm(range(start, cfg.steps), initial=start, total=cfg.steps, disable=not cfg.progress,
               desc="train", leave=False)
    t_last, tok_last = time.perf_counter(), tokens_seen
    t_saved = t_last
    wall0, cpu0 = t_last, time.process_time()
    cpu_last = cpu0
    # SIGTERM / SIGHUP / Ctrl-C: finish the step, checkpoint it, raise TrainingStopped.
    with StopSignals(enabled=run_dir is not None) as stop:
        for step in bar:
            for group in opt.param_groups:
                group["lr"] = group["base_lr"] * lr_factor(step, cfg)
            tokens, mask = sample(cfg.batch_size, gen)
            tokens = tokens.to(device)
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=use_bf16):
                loss = masked_next_token_loss(forward, tokens, mask)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.grad_clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            opt.step()
            tokens_seen += tokens.numel()
            losses.append(loss.item())
            done = step + 1
            now, cpu_now = time.perf_counter(), time.process_time()
            # Wall pace, and CPU pace (all of the process's threads): on a shared machine the
            # wall pace drops with the load, the CPU pace measures the step itself.
            tok_s = (tokens_seen - tok_last) / max(now - t_last, 1e-9)
            tok_cpu_s = (tokens_seen - tok_last) / max(cpu_now - cpu_last, 1e-9)
            t_last, cpu_last, tok_last = now, cpu_now, tokens_seen
            bar.set_postfix(loss=f"{losses[-1]:.3f}", tok_s=f"{tok_s:,.0f}")
            record = {"step": done, "tokens": tokens_seen, "lr": opt.param_groups[0]["lr"],
                      "train_loss": losses[-1], "tokens_per_s": round(tok_s, 1),
                      "tokens_per_cpu_s": round(tok_cpu_s, 1)}
            last = done == cfg.steps
            if evaluate is not None and (last or (cfg.eval_every and done % cfg.eval_every == 0)):
                model.eval()
                with torch.no_grad(), torch.autocast(device_type=device.type,
                                                     dtype=torch.bfloat16, enabled=use_bf16):
                    record.update(evaluate(model))
                model.train()
                if early.update(record):
                    record["early_stop"] = True
                    last = True
                if best is not None and early.improved:
                    best.keep(model, done, early.best)
            if run_dir is not None:
                _append_jsonl(run_dir / METRICS_FILE, record)
                due = cfg.checkpoint_minutes and now - t_saved >= 60 * cfg.checkpoint_minutes
                if (last or due or stop.received is not None
                        or (cfg.checkpoint_every and done % cfg.checkpoint_every == 0)):
                    spent = {"wall_s": round(timing["wall_s"] + time.perf_counter() - wall0, 3),
                             "cpu_s": round(timing["cpu_s"] + time.process_time() - cpu0, 3),
                             "from_step": timing["from_step"]}
                    saved = save_train_state(run_dir, model, opt, gen, done, tokens_seen,
                                             cfg.to_dict(), card=card, timing=spent)
                    t_saved = time.perf_counter()
                    if stop.received is not None:
                        bar.close()
                        raise TrainingStopped(stop.received, done, saved)
            if last:
                break
    if best is not None:
        best.restore(model)
    model.eval()
    return losses


def train(model, sample: Sampler, steps: int, batch_size: int = 32, lr: float = 1e-3,
          weight_decay: float = 0.01, warmup: int = 20, seed: int = 0,
          progress: bool = True) -> list[float]:
    """Train `model` on batches from `sample(batch_size, generator)`; returns the loss per step.

    The toy recipes' entry point: `fit` with no run directory, no evaluation.
    """
    cfg = TrainConfig(steps=steps, batch_size=batch_size, lr=lr, weight_decay=weight_decay,
                      warmup=warmup, seed=seed, progress=progress)
    return fit(model, sample, cfg)
