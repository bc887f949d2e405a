"""Resumable training checkpoints: safetensors + JSON, never pickle.

A run directory holds `step-0000123/` checkpoints and a `latest` file naming the newest. Each
checkpoint is a normal model checkpoint (`save_pretrained`, float32 weights) plus
`optimizer.safetensors` (AdamW moments and steps, the batch generator's and torch's RNG states)
and `trainer_state.json` (step, tokens seen, the optimizer's param groups, the train config).
A checkpoint is complete before `latest` is switched to it (an atomic rename), and older
checkpoints are removed only after that, so an interrupted save never loses the last one.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from attnlens.hooked_models.checkpoint import check_state_dict, read_config, write_text_atomic

LATEST_FILE = "latest"
OPTIMIZER_FILE = "optimizer.safetensors"
STATE_FILE = "trainer_state.json"


def runs_root() -> Path:
    """Where long training runs keep their checkpoints by default: `$ATTNLENS_RUNS`, else
    `~/.cache/attnlens`, outside the work tree. A session's work tree is laid anew from git, so
    checkpoints under it never reach the next session; a directory outside it does when the
    next session is handed the same machine."""
    return Path(os.environ.get("ATTNLENS_RUNS") or Path.home() / ".cache" / "attnlens")


def latest_checkpoint(run_dir) -> Path | None:
    """The checkpoint `latest` points to, or None for a fresh run directory."""
    pointer = Path(run_dir) / LATEST_FILE
    if not pointer.is_file():
        return None
    ckpt = Path(run_dir) / pointer.read_text().strip()
    if not (ckpt / STATE_FILE).is_file():
        raise ValueError(f"{pointer} names {ckpt.name}, which has no {STATE_FILE}")
    return ckpt


def save_train_state(run_dir, model, opt, gen: torch.Generator, step: int, tokens: int,
                     train_cfg: dict, card: dict | None = None,
                     timing: dict | None = None) -> Path:
    """Write checkpoint `step-<step>` and point `latest` at it (older ones are removed).

    `timing` (`wall_s`, `cpu_s`, `from_step`: the training time spent on the steps this
    checkpoint holds, counted since step `from_step`) is kept in the state, so a resumed run
    continues the count and time spent on steps a kill threw away is not counted.
    """
    run_dir = Path(run_dir)
    ckpt = run_dir / f"step-{step:07d}"
    card = {**(card or {}), "step": step, "tokens": tokens}
    model.save_pretrained(ckpt, card=card)
    sd = opt.state_dict()
    tensors = {"rng.generator": gen.get_state(), "rng.torch": torch.get_rng_state()}
    for index, state in sd["state"].items():
        for key, value in state.items():
            if not torch.is_tensor(value):
                raise ValueError(f"optimizer state {index}.{key} is not a tensor: {value!r}")
            tensors[f"state.{index}.{key}"] = value.detach().contiguous().cpu()
    save_file(tensors, str(ckpt / OPTIMIZER_FILE))
    meta = {"step": step, "tokens": tokens, "param_groups": sd["param_groups"],
            "train_config": train_cfg}
    if timing is not None:
        meta["timing"] = timing
    (ckpt / STATE_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True))
    write_text_atomic(run_dir / LATEST_FILE, ckpt.name)
    for old in run_dir.glob("step-*"):
        if old.is_dir() and old.name != ckpt.name:
            shutil.rmtree(old, ignore_errors=True)
    return ckpt


def load_train_state(ckpt, model, opt, gen: torch.Generator, train_cfg: dict) -> tuple[int, int]:
    """Restore weights, optimizer, RNGs from `ckpt`; returns (step, tokens seen).

    The run must be the same run: same model config and the same train config, else a resumed
    run would silently follow another schedule.
    """
    ckpt = Path(ckpt)
    meta = read_train_state(ckpt)
    saved_cfg = read_config(ckpt)
    if saved_cfg.to_dict() != model.cfg.to_dict():
        raise ValueError(f"{ckpt / 'config.json'} describes another model than the one being "
                         "trained; use a fresh run directory")
    if meta["train_config"] != json.loads(json.dumps(train_cfg)):
        diff = sorted(k for k in train_cfg if meta["train_config"].get(k) != train_cfg[k])
        raise ValueError(f"{ckpt / STATE_FILE} was written with another train config "
                         f"(differs in {diff}); use a fresh run directory or the same settings")
    weights = load_file(str(ckpt / "model.safetensors"), device="cpu")
    check_state_dict(model, weights)
    model.load_state_dict(weights, strict=True)
    tensors = load_file(str(ckpt / OPTIMIZER_FILE), device="cpu")
    state: dict[int, dict] = {}
    for key, value in tensors.items():
        if key.startswith("state."):
            _, index, name = key.split(".", 2)
            state.setdefault(int(index), {})[name] = value
    groups = meta["param_groups"]
    for group in groups:
        if "betas" in group:
            group["betas"] = tuple(group["betas"])
    opt.load_state_dict({"state": state, "param_groups": groups})
    gen.set_state(tensors["rng.generator"])
    torch.set_rng_state(tensors["rng.torch"])
    return int(meta["step"]), int(meta["tokens"])


def read_train_state(ckpt) -> dict:
    """Checkpoint `ckpt`'s trainer_state.json: step, tokens, train config, timing."""
    return json.loads((Path(ckpt) / STATE_FILE).read_text())


def load_timing(ckpt) -> dict | None:
    """The `timing` saved with checkpoint `ckpt` (None for checkpoints written before it was
    kept)."""
    return read_train_state(ckpt).get("timing")


def rewind_metrics(path: Path, step: int) -> None:
    """Drop metric lines after `step` (written after the checkpoint a run resumes from)."""
    if not path.is_file():
        return
    lines = [ln for ln in path.read_text().splitlines() if ln.strip()]
    kept = [ln for ln in lines if json.loads(ln)["step"] <= step]
    if len(kept) != len(lines):
        write_text_atomic(path, "".join(ln + "\n" for ln in kept))


TRAINING_ROW_KEYS = frozenset({"step", "tokens", "lr", "train_loss", "tokens_per_s",
                               "tokens_per_cpu_s"})


def thin_metrics(src: Path, dst: Path, every: int) -> dict:
    """Write `src`'s metrics log to `dst` with every row that holds an evaluation (any key
    beyond a training row's), and of the per-step training rows the first, the last and every
    `every`-th step. A released model ships this: the full log is one row per step (about 1 MB
    for 10,000 steps) and what reads it (loss curves, the phase change) needs no more.
    Returns what a card records: `{"metrics_rows": "...", "every": every}`."""
    if every < 1:
        raise ValueError(f"every must be >= 1, got {every}")
    lines = [ln for ln in Path(src).read_text().splitlines() if ln.strip()]
    if not lines:
        raise ValueError(f"{src} is empty: no training log to release")
    rows = [json.loads(ln) for ln in lines]
    last = max(r["step"] for r in rows)
    kept = [ln for ln, r in zip(lines, rows, strict=True)
            if set(r) - TRAINING_ROW_KEYS or r["step"] in (1, last) or r["step"] % every == 0]
    write_text_atomic(Path(dst), "".join(ln + "\n" for ln in kept))
    return {"metrics_rows": (f"every evaluation row; the training rows of step 1, the last "
                             f"step and every {every}th step"), "every": every}
