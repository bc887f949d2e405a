"""The notebooks: committed with outputs that match their sources, and each runs top to bottom.

The committed notebooks are built by `python notebooks/build_notebooks.py --execute` from
notebooks/src/*.py; here each source is executed again in a fresh kernel (a failing cell fails the
test, naming the cell). Outputs are not compared byte for byte: numbers may differ across CPUs.
"""

import sys
from pathlib import Path

import nbformat
import pytest

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
sys.path.insert(0, str(NOTEBOOKS))
import build_notebooks  # noqa: E402
from tiers import documented, documented_params  # noqa: E402

SOURCES = build_notebooks.sources()
PLOTLY = "application/vnd.plotly.v1+json"


def test_there_are_notebooks():
    assert len(SOURCES) >= 3, "notebooks/src/ has too few notebook sources"


@documented("notebook")
def test_committed_notebooks_are_current():
    problems = build_notebooks.stale()
    assert not problems, (f"stale notebooks: {problems}; refresh with "
                          f"`{build_notebooks.REFRESH}`")


@pytest.mark.parametrize("stem", sorted(SOURCES))
def test_committed_figures_carry_a_png(stem):
    """GitHub cannot draw plotly JSON: every plotly output also holds a static PNG."""
    nb = nbformat.read(str(NOTEBOOKS / f"{stem}.ipynb"), as_version=4)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    for o in outputs:
        if PLOTLY in o.get("data", {}):
            assert "image/png" in o.data, f"{stem}: a plotly figure without its PNG"


@pytest.mark.parametrize("stem", sorted(SOURCES))
def test_every_notebook_draws_a_figure(stem):
    """Each notebook shows what it computes, not only tables (notebook 07 had 8 outputs and
    no figure; issue 48)."""
    nb = nbformat.read(str(NOTEBOOKS / f"{stem}.ipynb"), as_version=4)
    figures = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
               if PLOTLY in o.get("data", {})]
    assert figures, f"{stem}: no figure among its committed outputs"


def test_parse_reads_percent_cells():
    cells = build_notebooks.parse("# %% [markdown]\n# # Title\n#\n# text\n\n# %%\nx = 1\nx\n")
    assert cells == [("md", "# Title\n\ntext"), ("code", "x = 1\nx")]


@pytest.mark.parametrize("text, message", [
    ("x = 1\n# %%\ny\n", "before the first"),
    ("# %% [markdown]\nnot a comment\n", "must start with '# '"),
    ("# %%\n\n# %%\nx\n", "empty code cell"),
])
def test_parse_rejects_malformed_sources(text, message):
    with pytest.raises(ValueError, match=message):
        build_notebooks.parse(text, "bad.py")


def test_stale_names_what_is_wrong(tmp_path, monkeypatch):
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.py").write_text("# %%\n1 + 1\n")
    monkeypatch.setattr(build_notebooks, "SRC", src)
    assert build_notebooks.stale(tmp_path) == ["a.ipynb: missing"]
    nb = build_notebooks.notebook_from(src / "a.py")
    nbformat.write(nb, str(tmp_path / "a.ipynb"))
    assert build_notebooks.stale(tmp_path) == ["a.ipynb: code cells [0] have no outputs"]
    (src / "a.py").write_text("# %%\n2 + 2\n")
    assert "a.ipynb: cells differ from" in build_notebooks.stale(tmp_path)[0]
    (tmp_path / "b.ipynb").write_text((tmp_path / "a.ipynb").read_text())
    assert "b.ipynb: no source notebooks/src/b.py" in build_notebooks.stale(tmp_path)


# Executing every notebook takes about 4 minutes (02 alone 2): the fast tier runs 03 (10 s);
# make reproduce runs them all.
@pytest.mark.parametrize("stem", documented_params("notebook", sorted(SOURCES), ids=str,
                                                   keep=["03_mta"]))
def test_notebook_runs(stem):
    # Interactive figures only (no PNG): the same cells, without a headless browser.
    nb = build_notebooks.execute(build_notebooks.notebook_from(SOURCES[stem]),
                                 renderer="plotly_mimetype")
    empty = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and not c.outputs]
    assert not empty, f"{stem}: code cells {empty} produced no output"


def _outputs_text(cell) -> str:
    return "\n".join(o.get("text", "") or o.get("data", {}).get("text/plain", "")
                     for o in cell.outputs)


@pytest.mark.parametrize("stem", ["01_quickstart", "02_induction_heads"])
def test_the_first_notebooks_open_on_the_text_models(stem):
    """Issue 26 item 6: notebooks 01 and 02 start from every bundled text language model (the
    committed outputs list them all), before any toy model."""
    from attnlens.hooked_models import zoo

    nb = nbformat.read(str(NOTEBOOKS / f"{stem}.ipynb"), as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert 'zoo.available(kind="text-lm")' in code[0].source
    assert '"induction-' not in code[0].source and 'kind="induction"' not in code[0].source
    for name in zoo.available(kind="text-lm"):
        assert name in _outputs_text(code[0]), f"{stem}: {name} is not in its first table"


def test_the_induction_notebook_states_each_text_models_verdict():
    """Notebook 02 says of every text model whether it meets the zoo's bar, has an induction
    head but misses the copy-ratio half, or has none, as its card's probe numbers decide
    (text-mha-l2: an induction head, copy ratio 0.68 against the bar's 0.5)."""
    from attnlens.hooked_models import zoo
    from attnlens.lab.text_studies import forms_induction, has_induction_head

    nb = nbformat.read(str(NOTEBOOKS / "02_induction_heads.ipynb"), as_version=4)
    printed = "\n".join(_outputs_text(c) for c in nb.cells if c.cell_type == "code")
    for name in zoo.available(kind="text-lm"):
        metrics = zoo.load(name).card["metrics"]
        verdict = ("meets the bar" if forms_induction(metrics) else
                   "an induction head, copy-ratio bar missed"
                   if has_induction_head(metrics) else "no induction head")
        assert f"{name}: {verdict}:" in printed
    assert "text-mha-l2: an induction head, copy-ratio bar missed:" in printed
    assert "text-mha-l1: no induction head:" in printed
