"""Which 1000-step paper-task models the larger-budget runs of issue 24 replace (item 5).

A setting's old models (2 layers of d_model 64, 1000 CPU steps, one seed for CoPE and Infini)
are superseded by its larger-budget group (`-long` / `-full`: 4 layers, early stopping, three
seeds) when that group scores better on the setting's summary score, mean over each side's
shipped seeds:

- CoPE Flip-Flop and counting: the mean error over the splits both cards report (lower wins);
- Infini passkey: the mean token accuracy over the lengths both cards test (higher wins);
- DCMHA conjunction: the held-out accuracy (higher wins).

The old models stay in the zoo as the baselines of docs/reproduction.md's 1000-step sections;
`hooked_models/zoo/superseded.json` (written by `python -m attnlens.lab.paper report`, checked
by a test) names each one's replacements, so `attnlens.hooked_models.zoo.load` warns and points at
them, `python -m attnlens.lab.paper list` says so, and `attnlens serve --zoo paper` lists them last.
A setting whose new group does not score better keeps its old models unmarked.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from attnlens.hooked_models.zoo import SUPERSEDED_FILE, ZOO_DIR

# old recipe name (a regular expression) -> the name of its replacements (with the match's
# groups), the summary score, and whether higher is better
RULES = [
    (r"cope-flipflop-(?P<v>[a-z]+)-s\d", "cope-flipflop-{v}-long-s", "mean error", False),
    (r"cope-counting-(?P<n>[35])var-(?P<v>[a-z]+)-s\d", "cope-counting-{n}var-{v}-long-s",
     "mean error", False),
    (r"infini-passkey-s\d", "infini-passkey-long-s", "mean token accuracy", True),
    (r"dcmha-conjunction-(?P<v>dcmha|mha)-s\d", "dcmha-conjunction-full-{v}-s", "accuracy",
     True),
]


def _score(metrics: dict, keys: list[str]) -> float:
    return sum(metrics[k] for k in keys) / len(keys)


def _keys(kind: str, old: dict, new: dict) -> list[str]:
    """The metric keys the score averages: those both cards report."""
    if kind == "accuracy":
        return ["accuracy"]
    pattern = r"error_.+" if kind == "mean error" else r"acc_x\d+"
    return sorted(k for k in old["metrics"] if re.fullmatch(pattern, k) and k in new["metrics"])


def comparisons(cards: dict[str, dict]) -> dict[str, dict]:
    """`{old name: {"by": [replacements], "score": ..., "old": x, "new": y, "seeds": [n_old,
    n_new], "better": bool}}` for every shipped old model with replacements shipped."""
    out = {}
    for pattern, stem, kind, higher in RULES:
        olds = [n for n in cards if re.fullmatch(pattern, n)]
        for name in olds:
            target = stem.format(**re.fullmatch(pattern, name).groupdict())
            group = sorted(n for n in cards if re.fullmatch(re.escape(target) + r"\d+", n))
            peers = [n for n in olds if stem.format(**re.fullmatch(pattern, n).groupdict())
                     == target]
            if not group:
                continue
            keys = _keys(kind, cards[name], cards[group[0]])
            if not keys:
                raise ValueError(f"{name} and {group[0]} report no common {kind} metric")
            old = sum(_score(cards[n]["metrics"], keys) for n in peers) / len(peers)
            new = sum(_score(cards[n]["metrics"], keys) for n in group) / len(group)
            out[name] = {"by": group, "score": f"{kind} ({', '.join(keys)})",
                         "old": round(old, 4), "new": round(new, 4),
                         "seeds": [len(peers), len(group)],
                         "better": (new > old) if higher else (new < old)}
    return dict(sorted(out.items()))


def superseded(cards: dict[str, dict]) -> dict[str, dict]:
    """The `comparisons` whose replacements score better (without the "better" flag): the
    table of `hooked_models/zoo/superseded.json`."""
    return {name: {k: v for k, v in c.items() if k != "better"}
            for name, c in comparisons(cards).items() if c["better"]}


def write(cards: dict[str, dict], path: Path = ZOO_DIR / SUPERSEDED_FILE) -> dict:
    table = superseded(cards)
    path.write_text(json.dumps(table, indent=1) + "\n", encoding="utf-8")
    return table
