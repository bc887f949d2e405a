"""The generated tables of docs/attribution.md: the shipped transcoders' metrics (from their
cards) and the findings (from docs/figures/attribution/*_summary.csv, written by
`python -m attnlens.lab.attribution_study`).

    python -m attnlens.reports.attribution_docs          # rewrite the tables in place
    python -m attnlens.reports.attribution_docs --check  # exit 1 when they are stale

Each table sits between `<!-- generated: NAME -->` and `<!-- end: NAME -->`; the prose around
them is written by hand.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import pandas as pd

from attnlens.lab.transcoders import MLP_MODELS, transcoder_dir

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "attribution.md"
FIGURES = ROOT / "docs" / "figures" / "attribution"
REFRESH = "python -m attnlens.reports.attribution_docs"


def transcoder_table() -> str:
    lines = ["| model | EV per layer | L0 | dead (max) | loss + per layer | loss + all | "
             "clean loss | answer error clean -> replaced |", "|---|---|---|---|---|---|---|---|"]
    for name in MLP_MODELS:
        path = transcoder_dir(name) / "card.json"
        if not path.is_file():
            continue
        m = json.loads(path.read_text())["metrics"]
        layers = [m["layers"][k] for k in sorted(m["layers"], key=int)]
        ev = " / ".join(f"{r['explained_variance']:.2f}" for r in layers)
        l0 = f"{sum(r['l0'] for r in layers) / len(layers):.1f}"
        dead = f"{max(r['dead_fraction'] for r in layers):.1%}"
        inc = " / ".join(f"{r['loss_increase']:+.3f}" for r in layers)
        err = m.get("answer_error")
        err = f"{err['clean']:.1%} -> {err['replaced']:.1%}" if err else ""
        lines.append(f"| `{name}` | {ev} | {l0} | {dead} | {inc} | "
                     f"{m['all_layers_loss_increase']:+.3f} | {m['clean_loss']:.3f} | {err} |")
    return "\n".join(lines)


def _interval(row) -> str:
    return f"{row['mean']:.3g} [{row['low']:.3g}, {row['high']:.3g}]"


INDUCTION_COLUMNS = [
    ("target_prob", "p(target)"), ("error_share", "error share"),
    ("score", "score at key"), ("control_score", "score at control key"),
    ("key_prev_contribution", "key side from key-1"),
    ("control_key_prev_contribution", "same, control key"),
    ("key_prev_share", "key-1 share of key side"),
    ("prev_signal_via_prev_head", "of which via prev-token head"),
    ("query_self_share", "query share of query side"),
]
COMPOSE_COLUMNS = [("compose_pre_other_heads_share", "pre-softmax score from other heads"),
                   ("compose_post_other_heads_share", "pattern from other heads")]
COUNTING_COLUMNS = [("target_prob", "p(answer)"), ("error_share", "error share"),
                    ("counted_token_fraction", "counted tokens' share of the prompt"),
                    ("counted_direct_share", "their share of direct effects"),
                    ("counted_influence_share", "their share of influence")]


def _table(summary: pd.DataFrame, columns, by_head: bool = True) -> str:
    keys = ["model", "head"] if by_head else ["model"]
    header = "| " + " | ".join(keys + [label for _, label in columns]) + " |"
    lines = [header, "|" + "---|" * (len(keys) + len(columns))]
    for key, group in summary.groupby(keys, sort=False):
        key = key if isinstance(key, tuple) else (key,)
        values = {r["measure"]: _interval(r) for _, r in group.iterrows()}
        if not any(m in values for m, _ in columns):
            continue
        cells = [f"`{key[0]}`", *key[1:]] + [values.get(m, "") for m, _ in columns]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def induction_table() -> str:
    return _table(pd.read_csv(FIGURES / "induction_summary.csv"), INDUCTION_COLUMNS)


def compose_table() -> str:
    summary = pd.read_csv(FIGURES / "induction_summary.csv")
    return _table(summary[summary.model.str.contains("dcmha")], COMPOSE_COLUMNS)


def counting_table() -> str:
    return _table(pd.read_csv(FIGURES / "counting_summary.csv"), COUNTING_COLUMNS,
                  by_head=False)


SECTIONS = {"transcoders": transcoder_table, "induction": induction_table,
            "compose": compose_table, "counting": counting_table}


def fill(text: str) -> str:
    """`text` with every generated section rewritten."""
    for name, make in SECTIONS.items():
        pattern = re.compile(rf"(<!-- generated: {name} -->\n)(?:.*?\n)?(<!-- end: {name} -->)",
                             re.S)
        if not pattern.search(text):
            raise ValueError(f"docs/attribution.md has no section {name!r} (markers "
                             f"<!-- generated: {name} --> ... <!-- end: {name} -->)")
        text = pattern.sub(lambda m, make=make: m.group(1) + make() + "\n" + m.group(2), text)
    return text


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    text = DOC.read_text()
    new = fill(text)
    if args.check:
        if new != text:
            print(f"docs/attribution.md is stale; refresh it with `{REFRESH}`")
            return 1
        return 0
    DOC.write_text(new)
    print("wrote docs/attribution.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
