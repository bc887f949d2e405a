"""attnlens.reports.readme_table: the summary table of the text models, from the cards and the
induction study. It opens docs/zoo.md with the words of attnlens.reports.zoo_findings (issue 46:
the README links it instead of carrying it)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from attnlens.reports import zoo_docs, zoo_findings
from attnlens.reports.readme_table import summary_table


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


def test_zoo_md_opens_with_the_table_and_no_findings_about_models_it_lacks(zoo, tmp_path):
    """A zoo that lacks a model the findings name (this small one) gets the table alone."""
    section = zoo_docs.glance_section(zoo, tmp_path / "studies")
    assert section.startswith("## The text models at a glance\n\n" + zoo_findings.INTRO)
    assert summary_table(zoo, tmp_path / "studies") in section
    assert zoo_findings.findings(["text-mha-l1", "text-mta-l1", "text-mha-l2"]) == ""
    assert "What they show" not in section
    assert zoo_docs.glance_section(zoo, tmp_path / "elsewhere") == ""   # not studied yet


def test_the_findings_name_only_shipped_models_and_sit_under_the_table():
    from attnlens.hooked_models import zoo

    names = zoo_findings.named_models()
    assert "text-mha-l2" in names and "text-dcmha-l4mlp" in names
    assert set(names) <= set(zoo.available(kind="text-lm"))
    page = zoo_docs.DEFAULTS["out"].read_text(encoding="utf-8")
    table = summary_table(zoo_docs.DEFAULTS["zoo"], zoo_docs.DEFAULTS["studies"])
    glance = page.split("## The text models at a glance", 1)[1].split("\n## ", 1)[0]
    assert table in glance and zoo_findings.FINDINGS in glance
    assert glance.index(table) < glance.index(zoo_findings.FINDINGS)


def test_the_readme_links_the_table_instead_of_carrying_it():
    readme = (zoo_docs.ROOT / "README.md").read_text(encoding="utf-8")
    assert "](docs/zoo.md)" in readme
    assert "text-zoo table" not in readme and "| copy ratio |" not in readme
    assert "What they show" not in readme


def test_zoo_docs_writes_and_checks_the_page(zoo, tmp_path, monkeypatch):
    monkeypatch.setattr(zoo_docs, "render", lambda *a: "# zoo.md\n")   # the cards are minimal
    page = tmp_path / "zoo.md"
    args = ["--zoo", str(zoo), "--studies", str(tmp_path / "studies"), "--out", str(page)]
    assert zoo_docs.main([*args, "--check"]) == 1              # not written yet
    assert zoo_docs.main(args) == 0
    assert page.read_text() == "# zoo.md\n"
    assert zoo_docs.main([*args, "--check"]) == 0
    page.write_text("# zoo.md, edited by hand\n")
    assert zoo_docs.main([*args, "--check"]) == 1
