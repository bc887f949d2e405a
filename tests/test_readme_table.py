"""interp.zoo.readme_table: the README's table of the text models, from the cards and the
induction study, between two marker lines that nothing else may touch."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from interp.zoo import zoo_docs
from interp.zoo.readme_table import END, START, summary_table, with_table


def _model(zoo, name, params, cpu_s, val_loss, ratio):
    d = zoo / name
    d.mkdir(parents=True)
    (d / "card.json").write_text(json.dumps({
        "kind": "text-lm", "parameters": params, "cpu_time_s": cpu_s,
        "metrics": {"val_loss": val_loss, "copy_loss_ratio": ratio}}))


def _study(studies, rows):
    studies.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(studies / "induction.csv", index=False)


ROWS = [dict(model="text-mta-l1", variant="mta", shape="l1", induction_score=0.12,
             best_head="L0H1", distribution_stage="softmax", distribution_score=0.92,
             has_induction_head=True, forms_induction=True),
        dict(model="text-mha-l2", variant="mha", shape="l2", induction_score=0.37,
             best_head="L1H3", distribution_stage=None, distribution_score=None,
             has_induction_head=True, forms_induction=False),
        dict(model="text-mha-l1", variant="mha", shape="l1", induction_score=0.001,
             best_head="L0H1", distribution_stage=None, distribution_score=None,
             has_induction_head=False, forms_induction=False)]


@pytest.fixture
def zoo(tmp_path):
    zoo = tmp_path / "zoo"
    _model(zoo, "text-mha-l1", 1_120_000, 4032.0, 3.401, 1.0)
    _model(zoo, "text-mta-l1", 1_124_000, 5652.0, 2.688, 0.2512)
    _model(zoo, "text-mha-l2", 1_190_000, 4860.0, 2.861, 0.6812)
    _study(tmp_path / "studies", ROWS)
    return zoo


def test_rows_by_shape_then_variant_with_the_cards_numbers(zoo, tmp_path):
    lines = summary_table(zoo, tmp_path / "studies").splitlines()
    assert [ln.split(" | ")[0] for ln in lines[2:]] == [
        "| `text-mha-l1`", "| `text-mta-l1`", "| `text-mha-l2`"]
    assert lines[3] == ("| `text-mta-l1` | 1 layer | 1.12M | 1.57 | 2.69 | "
                        "L0H1 0.12; 0.92 at `softmax` | 0.25x | yes |")
    assert lines[4].endswith("| L1H3 0.37 | 0.68x | head only |")
    assert lines[2] == "| `text-mha-l1` | 1 layer | 1.12M | 1.12 | 3.40 | L0H1 0.00 | 1.00x | no |"


def test_a_different_best_head_at_the_row_stochastic_stage_is_named(zoo, tmp_path):
    """text-dcmha-l4mlp: L3H0 leads the composed pattern, L3H2 the softmax before it."""
    _study(tmp_path / "studies", [{**ROWS[0], "distribution_head": "L0H3"},
                                  {**ROWS[1], "distribution_head": None}, ROWS[2]])
    lines = summary_table(zoo, tmp_path / "studies").splitlines()
    assert "| L0H1 0.12; L0H3 0.92 at `softmax` |" in lines[3]
    assert lines[4].endswith("| L1H3 0.37 | 0.68x | head only |")
    _study(tmp_path / "studies", [{**ROWS[0], "distribution_head": "L0H1"}, *ROWS[1:]])
    assert "| L0H1 0.12; 0.92 at `softmax` |" in summary_table(
        zoo, tmp_path / "studies").splitlines()[3]


def test_a_model_missing_from_the_study_is_named(zoo, tmp_path):
    _study(tmp_path / "studies", ROWS[:2])
    with pytest.raises(ValueError, match=r"no row for \['text-mha-l1'\].*--only text-mha-l1"):
        summary_table(zoo, tmp_path / "studies")
    with pytest.raises(FileNotFoundError, match="induction.csv is missing"):
        summary_table(zoo, tmp_path / "elsewhere")


def test_only_the_text_between_the_markers_is_replaced():
    readme = f"intro\n\n{START}\nold row\n{END}\n\nafter\n"
    assert with_table(readme, "| new |") == f"intro\n\n{START}\n| new |\n{END}\n\nafter\n"
    for broken in ("no markers\n", f"{START}\n{START}\n{END}\n", f"{END}\nx\n{START}\n"):
        with pytest.raises(ValueError, match="exactly one"):
            with_table(broken, "| new |")


def test_zoo_docs_writes_and_checks_the_readme_table(zoo, tmp_path, monkeypatch):
    monkeypatch.setattr(zoo_docs, "render", lambda *a: "# zoo.md\n")   # the cards are minimal
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n{START}\n{END}\ntail\n")
    args = ["--zoo", str(zoo), "--studies", str(tmp_path / "studies"),
            "--out", str(tmp_path / "zoo.md"), "--readme", str(readme)]
    assert zoo_docs.main([*args, "--check"]) == 1              # both files stale
    assert zoo_docs.main(args) == 0
    assert "| `text-mta-l1` |" in readme.read_text() and readme.read_text().endswith("tail\n")
    assert zoo_docs.main([*args, "--check"]) == 0
    readme.write_text(readme.read_text().replace("0.25x", "0.30x"))   # a hand edit
    assert zoo_docs.main([*args, "--check"]) == 1
