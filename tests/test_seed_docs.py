"""docs/zoo.md's seed section (attnlens.reports.seed_docs): replicates grouped with their base model
by the cards' seeds, the proportion, t- and Welch intervals against hand computations, and the
summary table's words and order for a replicate (docs/zoo.md, attnlens.reports.readme_table)."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from attnlens.lab.text_studies import _parts
from attnlens.reports.readme_table import _shape_rank, shape_text
from attnlens.reports.seed_docs import proportion_interval, seed_findings, seed_groups

T_975 = {1: 12.706205, 2: 4.302653}          # two-sided 95% t quantiles by degrees of freedom


def _row(model, head, bar, ratio, loss):
    return dict(model=model, has_induction_head=head, forms_induction=bar,
                copy_loss_ratio=ratio, val_loss=loss)


@pytest.fixture
def zoo(tmp_path):
    seeds = {"text-mha-l2": 0, "text-mha-l2-s1": 1, "text-mha-l2-s2": 2, "text-dcmha-l2": 0,
             "text-dcmha-l2-s1": 1, "text-cope-l2": 0, "text-mha-l1": 0}
    models = {}
    for name, seed in seeds.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "card.json").write_text(json.dumps({"seed": seed}))
        models[name] = tmp_path / name
    table = pd.DataFrame([_row("text-mha-l2", True, False, 0.68, 2.86),
                          _row("text-mha-l2-s2", True, True, 0.45, 2.80),
                          _row("text-mha-l2-s1", False, False, 0.97, 2.95),
                          _row("text-dcmha-l2", False, False, 0.99, 3.13),
                          _row("text-dcmha-l2-s1", False, False, 0.98, 3.10),
                          _row("text-cope-l2", True, False, 0.65, 2.79),
                          _row("text-mha-l1", False, False, 1.0, 3.40)])
    return table, models


def test_replicates_are_grouped_with_their_base_by_the_cards_seeds(zoo):
    table, models = zoo
    groups = seed_groups(table, models)
    assert list(groups) == ["text-dcmha-l2", "text-mha-l2"]          # cope has no replicate
    assert list(groups["text-mha-l2"]["model"]) == ["text-mha-l2", "text-mha-l2-s1",
                                                    "text-mha-l2-s2"]
    assert list(groups["text-mha-l2"]["seed"]) == [0, 1, 2]
    (models["text-mha-l2-s2"] / "card.json").write_text(json.dumps({"seed": 1}))
    with pytest.raises(ValueError, match="same training seed"):
        seed_groups(table, models)


def test_intervals_match_the_formulas(zoo):
    low, high = proportion_interval(3, 3)
    assert (low, high) == pytest.approx((0.025 ** (1 / 3), 1.0), abs=1e-6)   # Clopper-Pearson
    assert proportion_interval(0, 2) == pytest.approx((0.0, 1 - 0.025 ** 0.5), abs=1e-6)
    table, models = zoo
    text = seed_findings(table, models)
    lines = text.splitlines()
    mha = [0.68, 0.97, 0.45]                                  # by seed 0, 1, 2
    mean = sum(mha) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in mha) / 2)
    half = T_975[2] * sd / math.sqrt(3)
    assert lines[1] == (
        "- **text-mha-l2**, training seeds 0, 1, 2: an induction head in 2 of 3 (95% interval "
        f"of the proportion [0.09, {0.975 ** (1 / 3):.2f}]), the bar in 1 of 3 (95% "
        f"interval of the proportion [{1 - 0.975 ** (1 / 3):.2f}, 0.91]); copy ratio "
        f"0.68, 0.97, 0.45; mean {mean:.2f}, 95% t-interval [{mean - half:.2f}, "
        f"{mean + half:.2f}]; validation loss 2.860, 2.950, 2.800; mean 2.870, 95% t-interval "
        f"[{2.87 - T_975[2] * 0.0754983 / math.sqrt(3):.3f}, "
        f"{2.87 + T_975[2] * 0.0754983 / math.sqrt(3):.3f}].")
    assert lines[0].startswith("- **text-dcmha-l2**, training seeds 0, 1: an induction head in "
                               "0 of 2")
    # Welch: DCMHA (3.13, 3.10) - MHA (2.86, 2.95, 2.80) validation loss
    va, vb = 0.0212132 ** 2 / 2, 0.0754983 ** 2 / 3
    df = (va + vb) ** 2 / (va ** 2 / 1 + vb ** 2 / 2)
    assert 2 < df < 3
    diff = 3.115 - 2.87
    assert lines[2].startswith(f"- DCMHA - MHA validation loss: {diff:+.3f}, Welch 95% interval [")
    low, high = (float(x) for x in lines[2].split("[")[1].split("]")[0].split(", "))
    half = (high - low) / 2
    assert 3.182 <= half / math.sqrt(va + vb) <= 4.303          # t(0.975) at 3 and 2 df
    assert lines[2].endswith("(2 and 3 seeds).")


def test_one_replicate_alone_gives_no_interval_and_no_base_no_section(zoo, tmp_path):
    table, models = zoo
    only = {n: d for n, d in models.items() if n in ("text-mha-l2", "text-mha-l2-s1")}
    text = seed_findings(table, only)
    assert "0.68, 0.97; mean 0.82" in text and "Welch" not in text
    assert seed_findings(table, {"text-mha-l2": models["text-mha-l2"]}) == ""


def test_a_replicate_is_a_zoo_name_and_reads_as_its_seed():
    assert _parts("text-dcmha-l2-s2") == ("dcmha", "l2-s2")
    assert shape_text("l2-s1") == "2 layers, seed 1"
    assert shape_text("l2-pkgs") == "2 layers, 10x text"
    ranks = {s: _shape_rank(s) for s in ("l1", "l2", "l2-s1", "l2-mix", "l4mlp", "l9")}
    assert sorted(ranks, key=ranks.get) == ["l1", "l2", "l2-s1", "l2-mix", "l4mlp", "l9"]
