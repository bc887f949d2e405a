"""docs/zoo.md's seed section: the zoo's 2-layer models against their seed replicates.

The shipped text models are one training seed each (0). `text_recipes.SEED_RECIPES` trains the
2-layer MHA and DCMHA again with seeds 1 and 2 (same recipe, data, tokens); once shipped, they
sit in the induction study (`docs/figures/zoo/induction.csv`) like any zoo model, and this
section groups each base model with its replicates:

- how many seeds form an induction head / meet the bar, with a Clopper-Pearson 95% interval on
  the proportion (3 of 3 seeds still allows 0.29);
- the copy ratio and validation loss of each seed, their mean and 95% t-interval (2+ seeds);
- the DCMHA - MHA difference of the means, with Welch's 95% interval, where both have 2+ seeds.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd

from attnlens.reports.reproduction.page import t_interval, welch_interval

REPLICATE = re.compile(r"^(?P<base>text-[a-z]+-l2)(?:-s(?P<seed>\d+))?$")


def seed_groups(induction: pd.DataFrame, models: dict[str, Path]) -> dict[str, pd.DataFrame]:
    """`{base model: its rows of the induction study, one per seed, seed column added}` for
    every 2-layer base model with at least one replicate shipped. The seed is the card's."""
    rows = induction[induction["model"].isin(models)].copy()
    matched = rows["model"].map(lambda n: REPLICATE.match(n))
    rows = rows[matched.notna()]
    rows["base"] = [m["base"] for m in matched[matched.notna()]]
    rows["seed"] = [json.loads((Path(models[n]) / "card.json").read_text())["seed"]
                    for n in rows["model"]]
    groups = {}
    for base, g in rows.groupby("base", sort=True):
        if (g["model"] != base).any() and base in set(g["model"]):
            if g["seed"].duplicated().any():
                raise ValueError(f"{base}: two shipped models with the same training seed: "
                                 f"{sorted(g['model'])}")
            groups[base] = g.sort_values("seed").reset_index(drop=True)
    return groups


def proportion_interval(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Clopper-Pearson interval of a proportion of k successes in n trials."""
    from scipy.stats import binomtest

    ci = binomtest(k, n).proportion_ci(confidence_level=level, method="exact")
    return float(ci.low), float(ci.high)


def _spread(values: list[float], digits: int = 2) -> str:
    each = ", ".join(f"{v:.{digits}f}" for v in values)
    if len(values) < 2:
        return f"{each} (one seed: no interval)"
    mean, low, high = t_interval(values)
    return f"{each}; mean {mean:.{digits}f}, 95% t-interval [{low:.{digits}f}, {high:.{digits}f}]"


def seed_findings(induction: pd.DataFrame, models: dict[str, Path]) -> str:
    """The section's lines: one per base model, then the DCMHA - MHA differences (empty string
    when no replicate is shipped)."""
    groups = seed_groups(induction, models)
    lines = []
    for base, g in groups.items():
        n = len(g)
        seeds = ", ".join(str(int(s)) for s in g["seed"])
        parts = []
        for column, what in (("has_induction_head", "an induction head"),
                             ("forms_induction", "the bar")):
            k = int(g[column].astype(bool).sum())
            low, high = proportion_interval(k, n)
            parts.append(f"{what} in {k} of {n} (95% interval of the proportion "
                         f"[{low:.2f}, {high:.2f}])")
        lines.append(f"- **{base}**, training seeds {seeds}: {parts[0]}, {parts[1]}; copy ratio "
                     f"{_spread(list(g['copy_loss_ratio']))}; validation loss "
                     f"{_spread(list(g['val_loss']), 3)}.")
    mha, dcmha = groups.get("text-mha-l2"), groups.get("text-dcmha-l2")
    if mha is not None and dcmha is not None and min(len(mha), len(dcmha)) >= 2:
        for column, what in (("val_loss", "validation loss"), ("copy_loss_ratio", "copy ratio")):
            diff, low, high = welch_interval(list(dcmha[column]), list(mha[column]))
            lines.append(f"- DCMHA - MHA {what}: {diff:+.3f}, Welch 95% interval "
                         f"[{low:+.3f}, {high:+.3f}] ({len(dcmha)} and {len(mha)} seeds).")
    return "\n".join(lines)
