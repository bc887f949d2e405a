"""Metrics of a text language model, as its card records them and the card test re-measures.

- `val_loss`: mean next-token loss on fixed held-out windows (whole validation files, never
  trained on), each window `[BOS] + n_ctx-1 tokens`.
- `icl_score`: in-context learning score of Olsson et al. (2022): mean loss at a late position
  minus at an early one (their 500th vs 50th token; here 0.98 n_ctx vs 0.1 n_ctx, each averaged
  over 5 neighbouring positions). Negative: later tokens are predicted better thanks to context.
- `induction_score`: the best head's attention on the induction stripe of `[BOS] r r` repeated
  random tokens, at the `pattern` stage (the weights on the values); `repeat_loss`: loss on the
  second copy (low once induction works). Where `pattern` is not row-stochastic (MTA's
  post-softmax convolution and head mixing, DCMHA's post-softmax Compose, Infini's memory mix),
  a stripe score above 1 or from a head that only borrows others' maps is possible, so the
  probe also reports `induction_score_<stage>` at the last row-stochastic stage before it
  (`softmax`, `probs`, `local_pattern`).
- `head_table`: every head's previous-token, duplicate-token and induction scores
(attnlens.interp.tools.heads).

The validation windows are stored beside the weights (`eval_tokens.safetensors`, 64 KB), so a
card can be re-measured on any machine, whatever its Python's standard library holds.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

from attnlens.hooked_models.checkpoint import save_tensors
from attnlens.interp.tools.heads import induction_tables

EVAL_TOKENS_FILE = "eval_tokens.safetensors"
N_VAL_WINDOWS = 64
# The probes' seed: never a training seed (the zoo trains with seeds 0-2), so the probe's random
# token sequences are ones no training batch was drawn with.
PROBE_SEED = 20261125
# Issue 26's bar: halves of 100-200 tokens; 150 fits n_ctx 512 with room to spare.
PROBE_HALF = 150


def val_windows(stream: np.ndarray, n_ctx: int, bos: int, n: int = N_VAL_WINDOWS) -> torch.Tensor:
    """`[n n_ctx]` windows at evenly spaced starts of `stream`, each led by BOS."""
    body = n_ctx - 1
    if len(stream) < body + 1:
        raise ValueError(f"validation stream has {len(stream)} tokens, fewer than n_ctx={n_ctx}")
    starts = np.linspace(0, len(stream) - body, num=n, dtype=np.int64)
    rows = [np.concatenate([[bos], stream[s:s + body]]) for s in starts]
    return torch.from_numpy(np.stack(rows).astype(np.int64))


def save_eval_tokens(directory, windows: torch.Tensor) -> None:
    save_tensors({"val_windows": windows.to(torch.int32).contiguous()},
                 Path(directory) / EVAL_TOKENS_FILE)


def load_eval_tokens(directory) -> torch.Tensor:
    path = Path(directory) / EVAL_TOKENS_FILE
    if not path.is_file():
        raise ValueError(f"{directory} has no {EVAL_TOKENS_FILE}: not a text-zoo checkpoint")
    return load_file(str(path))["val_windows"].long()


def chunk_losses(model, windows: torch.Tensor, batch: int = 8, fwd_hooks=()):
    """Yield `[b pos-1]` next-token losses of `windows`, `batch` windows at a time (no grad,
    with `fwd_hooks` attached), for callers to reduce per position or per window."""
    with torch.no_grad(), model.hooks(fwd_hooks=list(fwd_hooks)):
        for i in range(0, len(windows), batch):
            chunk = windows[i:i + batch].to(model.W_E.device)
            yield model(chunk, return_type="loss", loss_per_token=True).float()


def position_losses(model, windows: torch.Tensor, batch: int = 8) -> torch.Tensor:
    """`[pos-1]` mean next-token loss at each position over `windows`."""
    total = None
    for per in chunk_losses(model, windows, batch):
        per = per.sum(0)
        total = per if total is None else total + per
    return (total / len(windows)).cpu()


def icl_positions(n_ctx: int) -> tuple[int, int]:
    """Early and late loss positions (Olsson's 50 and 500 of 512, scaled to n_ctx)."""
    early, late = round(0.1 * n_ctx), round(0.98 * n_ctx)
    return max(early, 2), min(late, n_ctx - 4)


def copy_losses(model, tokens: torch.Tensor, half: int) -> tuple[float, float]:
    """Mean next-token loss inside the first and inside the second copy of `[BOS] a a`.

    The first copy's first token (predicted from BOS alone) and the second copy's first token
    (predicted from the end of the first copy) are left out of both means.
    """
    per = model(tokens.to(model.W_E.device), return_type="loss",
                loss_per_token=True).float().cpu()
    # per[:, i] is the loss of predicting token i+1; copy one is tokens [1, half], two [half+1, 2h]
    first = per[:, 1:half].mean()
    second = per[:, half + 1:2 * half].mean()
    return float(first), float(second)


@torch.no_grad()
def induction_probe(model, batch: int = 8, seed: int = PROBE_SEED,
                    half: int | None = None) -> dict:
    """Issue 26's probe on `[BOS] r r`, r random token ids of the vocabulary (`seed`).

    Returns the best head's induction-stripe score, the first- and second-copy losses and
    their ratio `copy_loss_ratio` (< 0.5 with a score >= 0.3 is the zoo's bar), and the head
    `table`.
    """
    from attnlens.interp.tasks.induction import repeated_tokens

    half = half or min(PROBE_HALF, (model.cfg.n_ctx - 1) // 2)
    stage = distribution_stage(model)
    tables = induction_tables(model, ["pattern"] + ([stage] if stage else []), batch=batch,
                              half_len=half, seed=seed)
    table = tables["pattern"]
    tokens = repeated_tokens(batch, half, model.cfg.d_vocab, seed=seed)
    first, second = copy_losses(model, tokens, half)
    out = {"induction_score": float(table["induction_stripe"].max())}
    if stage is not None:
        out[f"induction_score_{stage}"] = float(tables[stage]["induction_stripe"].max())
    return out | {"first_copy_loss": first, "repeat_loss": second,
                  "copy_loss_ratio": second / first, "table": table}


@torch.no_grad()
def distribution_head(model, batch: int = 8, seed: int = PROBE_SEED,
                      half: int | None = None) -> tuple[str, str, float] | None:
    """`(stage, head label, score)` of the best head at the row-stochastic stage of
    `induction_probe` (the same probe, so `score` is the card's `induction_score_<stage>`), or
    None when the model's pattern is itself a distribution. It need not be the pattern's best
    head: text-dcmha-l4mlp's post-softmax Compose moves L3H2's induction map onto L3H0/L3H1."""
    stage = distribution_stage(model)
    if stage is None:
        return None
    half = half or min(PROBE_HALF, (model.cfg.n_ctx - 1) // 2)
    table = induction_tables(model, [stage], batch=batch, half_len=half, seed=seed)[stage]
    label = table["induction_stripe"].idxmax()
    return stage, str(label), float(table["induction_stripe"].max())


def distribution_stage(model) -> str | None:
    """The last row-stochastic map stage before `pattern` when `pattern` itself is not one
    (None when it is, or when no earlier stage is)."""
    stages = list(model.stages(0))
    names = [s.name for s in stages]
    if "pattern" not in names or stages[names.index("pattern")].row_stochastic:
        return None
    before = [s.name for s in stages[:names.index("pattern")] if s.row_stochastic]
    return before[-1] if before else None


@torch.no_grad()
def text_repeat_probe(model, windows: torch.Tensor, batch: int = 8,
                      half: int | None = None) -> dict:
    """The repeated-real-text probe: `[BOS] a a`, a = `half` held-out tokens of each window.

    Returns the first- and second-copy losses and their ratio (`text_copy_ratio`).
    """
    half = half or min(PROBE_HALF, (model.cfg.n_ctx - 1) // 2)
    if windows.shape[1] < 1 + half:
        raise ValueError(f"windows of {windows.shape[1]} tokens are shorter than 1 + {half}")
    seg = windows[:batch, 1:1 + half]
    tokens = torch.cat([windows[:batch, :1], seg, seg], dim=1)
    first, second = copy_losses(model, tokens, half)
    return {"text_first_copy_loss": first, "text_repeat_loss": second,
            "text_copy_ratio": second / first}


def evaluate_windows(model, windows: torch.Tensor) -> dict:
    """Every card metric of `model` on the validation `windows` (rounded to 4 decimals)."""
    model.eval()
    losses = position_losses(model, windows)
    early, late = icl_positions(model.cfg.n_ctx)
    loss_early = float(losses[early - 2:early + 3].mean())
    loss_late = float(losses[late - 2:late + 3].mean())
    probe = induction_probe(model) | text_repeat_probe(model, windows)
    table = probe.pop("table")
    cols = ["layer", "head", "previous_token", "duplicate_token", "induction_stripe"]
    heads = [{"label": label, **{c: (int(row[c]) if c in ("layer", "head")
                                     else round(float(row[c]), 4)) for c in cols}}
             for label, row in table[cols].iterrows()]
    out = {"val_loss": float(losses.mean()), "loss_early": loss_early, "loss_late": loss_late,
           "icl_score": loss_late - loss_early, "icl_positions": [early, late], **probe}
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in out.items()} | {
        "head_table": heads}


def evaluate_text_model(model, card: dict | None = None, directory=None) -> dict:
    """Card metrics of a saved text model (its stored validation windows)."""
    if directory is None:
        raise ValueError("evaluate_text_model needs the checkpoint directory (eval tokens)")
    return evaluate_windows(model, load_eval_tokens(directory))
