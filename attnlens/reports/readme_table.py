"""The summary table of the bundled text models (one row each: shape, parameters, CPU hours,
validation loss, best induction head, copy ratio, the zoo's bar), generated from their cards and
the induction study (`docs/figures/zoo/induction.csv`). It opens docs/zoo.md ("The text models at
a glance", written by `python -m attnlens.reports.zoo_docs`, whose `--check` fails when it is
stale), so a shipped model reaches the table without hand-copied numbers. (The module keeps its
name from the time the table sat in the README; the README now links docs/zoo.md.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from attnlens.lab.text_studies import released_models

SHAPE_ORDER = ("l1", "l2", "l2-mix", "l2-pkgs", "l4mlp")
VARIANT_ORDER = ("mha", "mta", "cope", "dcmha", "infini")
SHAPE_TEXT = {"l1": "1 layer", "l2": "2 layers", "l2-mix": "2 layers, data mix",
              "l2-pkgs": "2 layers, 10x text", "l4mlp": "4 layers + MLPs"}


def _replicate(shape: str) -> tuple[str, str] | None:
    """`(base shape, seed)` of a seed replicate's shape (`l2-s1` -> ("l2", "1")), else None."""
    base, _, seed = shape.partition("-s")
    return (base, seed) if seed.isdigit() and base in SHAPE_ORDER else None


def shape_text(shape: str) -> str:
    """`"2 layers, seed 1"` for a seed replicate's shape (`l2-s1`), else SHAPE_TEXT's words."""
    rep = _replicate(shape)
    return f"{SHAPE_TEXT[rep[0]]}, seed {rep[1]}" if rep else SHAPE_TEXT.get(shape, shape)


def _shape_rank(shape: str) -> float:
    """Replicates right after their base shape; unknown shapes last."""
    rep = _replicate(shape)
    if rep:
        return SHAPE_ORDER.index(rep[0]) + 0.5
    return SHAPE_ORDER.index(shape) if shape in SHAPE_ORDER else 99


def _verdict(row) -> str:
    if row["forms_induction"]:
        return "yes"
    return "head only" if row["has_induction_head"] else "no"


def _score(row) -> str:
    """The pattern-stage score and, for a variant whose pattern is not a distribution (MTA's can
    exceed 1, DCMHA's is composed, Infini's mixes in the memory), the score at its
    row-stochastic stage: the bar takes either (`text_studies.has_induction_head`)."""
    stage = row.get("distribution_stage")
    text = f"{row['induction_score']:.2f}"
    if isinstance(stage, str) and stage:
        text += f"; {_other_head(row)}{row['distribution_score']:.2f} at `{stage}`"
    return text


def _other_head(row) -> str:
    """`"L3H2 "` when the row-stochastic stage's best head is not the pattern's, else ``."""
    head = row.get("distribution_head")
    return f"{head} " if isinstance(head, str) and head != row["best_head"] else ""


def summary_table(zoo_dir: Path, studies: Path) -> str:
    """One row per shipped text model (by shape, then variant): layers, parameters, CPU hours,
    validation loss, best induction head and its score, the copy ratio and the zoo's bar."""
    models = released_models(zoo_dir)
    path = Path(studies) / "induction.csv"
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: run `python -m attnlens.lab.text_studies "
                                f"{zoo_dir}` first")
    induction = pd.read_csv(path).set_index("model")
    missing = sorted(set(models) - set(induction.index))
    if missing:
        raise ValueError(f"{path} has no row for {missing}: run `python -m "
                         f"attnlens.lab.text_studies {zoo_dir} --only {' '.join(missing)}`")

    def order(name: str):
        row = induction.loc[name]
        shape = _shape_rank(row["shape"])
        variant = (VARIANT_ORDER.index(row["variant"]) if row["variant"] in VARIANT_ORDER
                   else 99)
        return shape, variant, name

    rows = ["| model | shape | params | CPU-h | val loss | best induction head (score) | "
            "copy ratio | copies (bar) |",
            "|---|---|---:|---:|---:|---|---:|---|"]
    for name in sorted(models, key=order):
        card = json.loads((models[name] / "card.json").read_text())
        row = induction.loc[name]
        cpu = card.get("cpu_time_s")
        rows.append(f"| `{name}` | {shape_text(row['shape'])} | "
                    f"{card['parameters'] / 1e6:.2f}M | "
                    f"{'-' if cpu is None else f'{cpu / 3600:.2f}'} | "
                    f"{card['metrics']['val_loss']:.2f} | {row['best_head']} {_score(row)} | "
                    f"{card['metrics']['copy_loss_ratio']:.2f}x | {_verdict(row)} |")
    return "\n".join(rows)


__all__ = ["shape_text", "summary_table"]
