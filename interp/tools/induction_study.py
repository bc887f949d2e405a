"""An induction-head study on a probe of the user's choice: head scores, their loss, a head
knocked out (at any stage of the catalogue) and what moves, and the induction score across
training read from a run's `metrics.jsonl`.

A probe is either repeated random tokens `[BOS] r r` (Olsson et al.) or any text; both are scored
with the same detectors (`attnlens.interp.tools.heads.detect_heads`), the random probe also on its
exact induction stripe.

Example:
    >>> probe = make_probe(model, "random", half_len=10)                # doctest: +SKIP
    >>> scores, losses = ablation_effect(model, probe, [(0, 1)], hook="pattern")
    >>> losses["after"] - losses["before"]
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
from torch import Tensor

from attnlens.interp._common import as_tokens, check_int
from attnlens.interp.tasks.induction import repeated_tokens, second_half_loss_mask
from attnlens.interp.tools.heads import ablation_hooks, detect_heads, induction_table
from attnlens.interp.tools.outputs import next_token_losses

PROBES = ("random", "text")
SCORE_COLUMNS = ("previous_token", "duplicate_token", "induction")
METRICS_FILE = "metrics.jsonl"   # written by attnlens.training.trainer.fit beside the checkpoints


@dataclass
class Probe:
    """`tokens` `[batch pos]`; `loss_mask` `[batch pos-1]` selects the predictions whose loss is
    reported (the second copy of a random probe; every prediction of a text); `half_len` is set
    for the random probe, `seed` and `batch` describe how it was drawn."""

    kind: str
    tokens: Tensor
    loss_mask: Tensor
    half_len: int | None = None
    seed: int = 0

    @property
    def batch(self) -> int:
        return self.tokens.shape[0]


def make_probe(model, kind: str = "random", half_len: int | None = None, batch: int = 8,
               seed: int = 0, tokens=None) -> Probe:
    """A probe for `model`: `kind="random"` draws `batch` sequences `[BOS] r r` with `half_len`
    random tokens (default: as long as the context allows); `kind="text"` uses `tokens`
    (text or `[batch pos]` ids)."""
    if kind not in PROBES:
        raise ValueError(f"probe {kind!r}; choose one of {list(PROBES)}")
    if kind == "text":
        if tokens is None:
            raise ValueError("a text probe needs tokens (or text)")
        tokens = as_tokens(model, tokens)
        if tokens.shape[1] < 2:
            raise ValueError(f"the text has {tokens.shape[1]} token(s); the probe needs at "
                             "least 2")
        mask = torch.ones(tokens.shape[0], tokens.shape[1] - 1)
        return Probe("text", tokens, mask, None, seed)
    check_int("batch", batch)
    check_int("seed", seed, minimum=0)
    longest = (model.cfg.n_ctx - 1) // 2
    half = longest if half_len is None else check_int("half_len", half_len, minimum=2)
    if half > longest:
        raise ValueError(f"half_len={half} needs {1 + 2 * half} positions; {model.cfg.n_ctx} "
                         f"fit, so choose 2 .. {longest}")
    ids = repeated_tokens(batch, half, model.cfg.d_vocab, seed=seed).to(model.W_E.device)
    return Probe("random", ids, second_half_loss_mask(batch, half), half, seed)


def probe_scores(model, probe: Probe, stage: str = "pattern", fwd_hooks=()) -> pd.DataFrame:
    """Every head's previous-token, duplicate-token and induction scores on the probe (plus
    `induction_stripe` for the random probe), as `detect_heads` / `induction_table`."""
    if probe.kind == "random":
        return induction_table(model, probe.batch, probe.half_len, probe.seed, stage,
                               fwd_hooks=fwd_hooks)
    return detect_heads(model, probe.tokens, stage=stage, fwd_hooks=fwd_hooks)


def probe_loss(model, probe: Probe, fwd_hooks=()) -> float:
    """Mean next-token loss (nats) over the probe's `loss_mask`."""
    losses = next_token_losses(model, probe.tokens, fwd_hooks)
    mask = probe.loss_mask.to(losses.device, losses.dtype)
    return float((losses * mask).sum() / mask.sum())


def ablation_effect(model, probe: Probe, heads, hook: str = "z", how: str = "zero",
                    stage: str = "pattern") -> tuple[pd.DataFrame, dict[str, float]]:
    """Scores and loss before and after knocking out `heads` [(layer, head), ...] at `hook`
    ("z", "v" or any map stage; see `attnlens.interp.tools.heads.ablation_hooks`).

    Returns (a long DataFrame with `head_label`, `layer`, `head`, `score` (detector name),
    `before`, `after`, `delta`; and `{"before", "after", "delta"}` of `probe_loss`).

    Example:
        >>> scores, loss = ablation_effect(model, probe, [(0, 2)], hook="pattern")  # doctest: +SKIP
    """
    heads = list(heads)
    if not heads:
        raise ValueError("give at least one (layer, head) to knock out")
    hooks = ablation_hooks(model, heads, how, hook, tokens=probe.tokens if how == "mean" else None)
    before = probe_scores(model, probe, stage)
    after = probe_scores(model, probe, stage, fwd_hooks=hooks)
    columns = [c for c in (*SCORE_COLUMNS, "induction_stripe") if c in before.columns]
    parts = []
    for c in columns:
        part = before[["layer", "head"]].copy()
        part["score"] = c
        part["before"], part["after"] = before[c], after[c]
        parts.append(part)
    table = pd.concat(parts).rename_axis("head_label").reset_index()
    table["delta"] = table["after"] - table["before"]
    loss = {"before": probe_loss(model, probe), "after": probe_loss(model, probe, hooks)}
    loss["delta"] = loss["after"] - loss["before"]
    return table, loss


def training_curve(directory, key: str = "induction_score") -> pd.DataFrame:
    """`key` across training from `directory/metrics.jsonl` (the log of `trainer.fit`): one row
    per logged evaluation with `step`, `tokens` and every evaluation metric present.

    ValueError when the log is missing, a line is not a JSON object, or no line holds `key`.
    """
    path = Path(directory) / METRICS_FILE
    if not path.is_file():
        raise ValueError(f"{path} does not exist: this model has no training log")
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path} line {number} is not JSON: {err.msg}") from None
        if not isinstance(record, dict):
            raise ValueError(f"{path} line {number} is not a JSON object")
        value = record.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) \
                and math.isfinite(value) and isinstance(record.get("step"), int):
            rows.append({k: v for k, v in record.items()
                         if isinstance(v, (int, float)) and not isinstance(v, bool)})
    if not rows:
        raise ValueError(f"{path} holds no evaluation with {key!r}")
    return pd.DataFrame(rows).sort_values("step").reset_index(drop=True)
