"""docs/zoo.md's sharpness section, from the `score_spread` study table (`text_studies`)."""

from __future__ import annotations

import pandas as pd

# A variant's own pre-softmax steps "widen" (or "narrow") the q.k spread past this factor.
WIDEN = 1.5

INTRO = ("Where a head's attention gets its sharpness (`attnlens.interp.tools.score_spread`, "
         "the zoo's 8 study windows, query rows with at least 32 keys, means over a layer's "
         "heads): the spread (row standard deviation) of the raw q.k scores, the spread of "
         "the logits that enter the softmax (after CoPE's position logits, MTA's convolution "
         "and head mixing, DCMHA's pre-softmax Compose), their ratio, and the entropy and "
         "largest weight of the attention rows they give (a uniform row over 256 keys would "
         "have 5.5 nats).")


def by_layer(table: pd.DataFrame) -> pd.DataFrame:
    """One row per model and layer: means over heads, and `ratio` = logit / raw spread."""
    g = table.groupby(["model", "layer"], sort=True).agg(
        raw_std=("raw_std", "mean"), logit_std=("logit_std", "mean"),
        logit_stage=("logit_stage", "first"), entropy=("entropy", "mean"),
        max_weight=("max_weight", "mean")).reset_index()
    return g.assign(ratio=g.logit_std / g.raw_std)


def sharpness_section(table: pd.DataFrame) -> str:
    """The table and the findings it supports, in words."""
    rows = by_layer(table)
    lines = [INTRO, "", "| model | layer | q.k spread | logits entering the softmax | their "
             "spread | ratio | entropy (nats) | max weight |", "|---|---|---|---|---|---|---|---|"]
    for r in rows.itertuples():
        lines.append(f"| `{r.model}` | {r.layer} | {r.raw_std:.2f} | `{r.logit_stage}` | "
                     f"{r.logit_std:.2f} | {r.ratio:.2f} | {r.entropy:.2f} | "
                     f"{r.max_weight:.2f} |")
    lines.append("")
    for r in rows.itertuples():
        if r.ratio >= WIDEN or r.ratio <= 1 / WIDEN:
            lines.append(f"- `{r.model}` layer {r.layer}: `{r.logit_stage}` "
                         f"{'widens' if r.ratio > 1 else 'narrows'} the q.k spread "
                         f"{r.ratio:.1f}x ({r.raw_std:.2f} -> {r.logit_std:.2f}).")
    first = rows[rows.layer == 0].sort_values("raw_std")
    if len(first) > 1:
        low, high = first.iloc[0], first.iloc[-1]
        lines.append(f"- Layer 0's q.k spread ranges from {low.raw_std:.2f} (`{low.model}`) to "
                     f"{high.raw_std:.2f} (`{high.model}`); its attention's entropy from "
                     f"{first.entropy.min():.2f} to {first.entropy.max():.2f} nats.")
    return "\n".join(lines)
