"""Metrics of a text language model, as its card records them and the card test re-measures.

- `val_loss`: mean next-token loss on fixed held-out windows (whole validation files, never
  trained on), each window `[BOS] + n_ctx-1 tokens`.
- `icl_score`: in-context learning score of Olsson et al. (2022): mean loss at a late position
  minus at an early one (their 500th vs 50th token; here 0.98 n_ctx vs 0.1 n_ctx, each averaged
  over 5 neighbouring positions). Negative: later tokens are predicted better thanks to context.
- `induction_score`: the best head's attention on the induction stripe of `[BOS] r r` repeated
  random tokens; `repeat_loss`: loss on the second copy (low once induction works).
- `head_table`: every head's previous-token, duplicate-token and induction scores (interp.heads).

The validation windows are stored beside the weights (`eval_tokens.safetensors`, 64 KB), so a
card can be re-measured on any machine, whatever its Python's standard library holds.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from interp.heads import induction_table

EVAL_TOKENS_FILE = "eval_tokens.safetensors"
N_VAL_WINDOWS = 64
PROBE_SEED = 0


def val_windows(stream: np.ndarray, n_ctx: int, bos: int, n: int = N_VAL_WINDOWS) -> torch.Tensor:
    """`[n n_ctx]` windows at evenly spaced starts of `stream`, each led by BOS."""
    body = n_ctx - 1
    if len(stream) < body + 1:
        raise ValueError(f"validation stream has {len(stream)} tokens, fewer than n_ctx={n_ctx}")
    starts = np.linspace(0, len(stream) - body, num=n, dtype=np.int64)
    rows = [np.concatenate([[bos], stream[s:s + body]]) for s in starts]
    return torch.from_numpy(np.stack(rows).astype(np.int64))


def save_eval_tokens(directory, windows: torch.Tensor) -> None:
    save_file({"val_windows": windows.to(torch.int32).contiguous()},
              str(Path(directory) / EVAL_TOKENS_FILE))


def load_eval_tokens(directory) -> torch.Tensor:
    path = Path(directory) / EVAL_TOKENS_FILE
    if not path.is_file():
        raise ValueError(f"{directory} has no {EVAL_TOKENS_FILE}: not a text-zoo checkpoint")
    return load_file(str(path))["val_windows"].long()


@torch.no_grad()
def position_losses(model, windows: torch.Tensor, batch: int = 8) -> torch.Tensor:
    """`[pos-1]` mean next-token loss at each position over `windows`."""
    total = None
    for i in range(0, len(windows), batch):
        chunk = windows[i:i + batch].to(model.W_E.device)
        per = model(chunk, return_type="loss", loss_per_token=True).float().sum(0)
        total = per if total is None else total + per
    return (total / len(windows)).cpu()


def icl_positions(n_ctx: int) -> tuple[int, int]:
    """Early and late loss positions (Olsson's 50 and 500 of 512, scaled to n_ctx)."""
    early, late = round(0.1 * n_ctx), round(0.98 * n_ctx)
    return max(early, 2), min(late, n_ctx - 4)


@torch.no_grad()
def induction_probe(model, batch: int = 8, seed: int = PROBE_SEED) -> dict:
    """Best head's induction-stripe score and the second-copy loss on `[BOS] r r`."""
    from interp.tasks.induction import repeated_tokens, second_half_loss_mask

    half = min(64, (model.cfg.n_ctx - 1) // 2)
    table = induction_table(model, batch=batch, half_len=half, seed=seed)
    tokens = repeated_tokens(batch, half, model.cfg.d_vocab, seed=seed).to(model.W_E.device)
    per = model(tokens, return_type="loss", loss_per_token=True).float().cpu()
    mask = second_half_loss_mask(batch, half).bool()
    return {"induction_score": float(table["induction_stripe"].max()),
            "repeat_loss": float(per[mask].mean()), "table": table}


def evaluate_windows(model, windows: torch.Tensor) -> dict:
    """Every card metric of `model` on the validation `windows` (rounded to 4 decimals)."""
    model.eval()
    losses = position_losses(model, windows)
    early, late = icl_positions(model.cfg.n_ctx)
    loss_early = float(losses[early - 2:early + 3].mean())
    loss_late = float(losses[late - 2:late + 3].mean())
    probe = induction_probe(model)
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
