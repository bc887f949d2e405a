"""One row per (model, prompt set, analysis, row key) from a merged sweep table.

Each analysis's `summary` (attnlens.interp.sweep.analyses) says how a column combines over shards
and length groups: "mean" is weighted by `n_prompts` (the head detectors average over prompts, so
this equals the score on all prompts at once), "sum"/"min"/"max"/"any" as named. Weight-only
analyses have one shard per model; their summary is that shard's rows.

Example:
    >>> summary = summarise(merged)                    # doctest: +SKIP
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from attnlens.interp.sweep.analyses import ANALYSES

GROUP = ["model", "prompt_set", "analysis", "kind"]


def _combine(group: pd.DataFrame, columns: dict[str, str]) -> pd.Series:
    out = {"n_prompts": int(group["n_prompts"].sum()), "n_rows": len(group)}
    weights = group["n_prompts"].to_numpy(dtype=float)
    for col, how in columns.items():
        values = group[col]
        if how == "mean":
            x = values.to_numpy(dtype=float)
            out[col] = float(np.average(x, weights=weights)) if weights.sum() > 0 else float(
                x.mean())
        elif how == "sum":
            out[col] = float(values.to_numpy(dtype=float).sum())
        elif how == "min":
            out[col] = values.min()
        elif how == "max":
            out[col] = values.max()
        elif how == "any":
            out[col] = bool(values.astype(bool).any())
        else:
            raise ValueError(f"unknown summary rule {how!r} for column {col!r}")
    return pd.Series(out)


def summarise(merged: pd.DataFrame) -> pd.DataFrame:
    """The summary table (columns: GROUP, the analysis's keys, n_prompts, n_rows, summaries)."""
    frames = []
    for kind, part in merged.groupby("kind", sort=False):
        spec = ANALYSES[kind]
        part = part.dropna(axis=1, how="all")
        keys = [k for k in spec.keys if k in part.columns]
        columns = {c: how for c, how in spec.summary.items() if c in part.columns}
        if not columns:   # nothing to combine: keep the rows as they are
            frames.append(part.drop(columns=["shard", "seq_len"]))
            continue
        rows = [
            {**dict(zip(GROUP + keys, name, strict=True)), **_combine(g, columns).to_dict()}
            for name, g in part.groupby(GROUP + keys, sort=False, dropna=False)
        ]
        frames.append(pd.DataFrame(rows))
    frames = [f for f in frames if len(f)]
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=GROUP)
