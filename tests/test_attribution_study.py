"""The attribution-graph findings (docs/attribution.md): its tables are what the summaries say,
the summaries are what the per-prompt CSVs give, and a prompt's row is recomputed."""

import pandas as pd
import pytest
from tiers import documented, reproduce

from attnlens.lab import attribution_study as study
from attnlens.reports import attribution_docs

FIGURES = attribution_docs.FIGURES


def test_doc_tables_are_current():
    text = attribution_docs.DOC.read_text()
    assert attribution_docs.fill(text) == text, (
        f"docs/attribution.md is stale; refresh it with `{attribution_docs.REFRESH}`")


@pytest.mark.parametrize("name", ["induction", "counting"])
def test_summaries_come_from_the_rows(name):
    rows = pd.read_csv(FIGURES / f"{name}.csv")
    summary = pd.read_csv(FIGURES / f"{name}_summary.csv")
    again = study.summarize(rows)
    merged = summary.merge(again, on=["model", "measure"] + (["head"] if name == "induction"
                                                                   else []),
                           suffixes=("", "_again"))
    assert len(merged) == len(summary) == len(again)
    for column in ("mean", "low", "high"):
        assert (merged[column] - merged[f"{column}_again"]).abs().max() < 1e-3 * (
            1 + merged[column].abs().max())


def _same(row: dict, expected: pd.Series):
    for key, value in row.items():
        if isinstance(value, float):
            assert value == pytest.approx(float(expected[key]), rel=1e-4, abs=1e-6), key
        else:
            assert str(value) == str(expected[key]), key


@documented("study")
def test_an_induction_prompt_is_recomputed():
    rows = pd.read_csv(FIGURES / "induction.csv")
    df = study.study_model("text-mha-l4mlp", n_prompts=1, progress=False)
    expected = rows[(rows.model == "text-mha-l4mlp") & (rows.seed == study.EVAL_SEED)]
    assert len(expected) == len(df) == 2
    for (_, got), (_, want) in zip(df.iterrows(), expected.iterrows(), strict=True):
        _same(got.to_dict(), want)


@pytest.mark.parametrize("_", [pytest.param(0, marks=reproduce("study"))])
def test_a_counting_prompt_is_recomputed(_):
    rows = pd.read_csv(FIGURES / "counting.csv")
    df = study.study_counting(n_prompts=1, progress=False)
    _same(df.iloc[0].to_dict(), rows.iloc[0])
