"""The generated docs (docs/hooks.md, docs/cli.md) are current; every page's Python code runs."""

import linecache
import re
from pathlib import Path

import pytest
from tiers import documented

from attnlens.hooked_models import available_variants
from attnlens.reports import docs_gen

DOCS = Path(__file__).resolve().parent.parent / "docs"


@documented("report")
@pytest.mark.parametrize("name", sorted(docs_gen.GENERATED))
def test_generated_doc_is_current(name):
    expected = docs_gen.GENERATED[name]()
    path = DOCS / name
    assert path.is_file(), f"docs/{name} is missing; write it with `{docs_gen.REFRESH}`"
    assert path.read_text() == expected, (
        f"docs/{name} is stale; refresh it with `{docs_gen.REFRESH}`")


def test_stale_names_the_file_and_the_command(tmp_path, capsys, monkeypatch):
    for name, make in docs_gen.GENERATED.items():
        (tmp_path / name).write_text(make())
    assert docs_gen.stale(tmp_path) == []
    (tmp_path / "hooks.md").write_text((tmp_path / "hooks.md").read_text() + "edited by hand\n")
    assert docs_gen.stale(tmp_path) == ["hooks.md"]
    monkeypatch.setattr(docs_gen, "DOCS", tmp_path)
    assert docs_gen.main(["--check"]) == 1
    assert "docs/hooks.md is stale; refresh it with `python -m attnlens.reports.docs_gen`" in (
        capsys.readouterr().out)


def test_hooks_md_lists_every_variant_and_each_stage_of_its_catalogue():
    text = (DOCS / "hooks.md").read_text()
    for variant in available_variants():
        assert f"## `{variant}`" in text
        model = docs_gen._model(variant, {})
        for stage in model.stages(0):
            assert f"`hook_{stage.name}`" in text, (variant, stage.name)


def test_an_option_set_for_every_variant_is_required(monkeypatch):
    monkeypatch.setattr(docs_gen, "OPTION_SETS", [o for o in docs_gen.OPTION_SETS
                                                   if o[0] != "infini"])
    with pytest.raises(ValueError, match="infini"):
        docs_gen.hooks_markdown()


def test_cli_md_documents_every_subcommand_and_option():
    from attnlens.cli import build_parser

    text = (DOCS / "cli.md").read_text()
    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    for name, parser in sub.choices.items():
        assert f"## attnlens {name}" in text
        for action in parser._actions:
            for flag in action.option_strings:
                assert flag in text, (name, flag)


# A ```python block runs unless the line right above it says why it cannot, e.g.
# <!-- docs-test: skip (needs two CUDA GPUs) -->  (invisible in the rendered page).
SKIP_MARK = re.compile(r"<!-- docs-test: skip \((?P<why>[^)]+)\) -->\n$")
BLOCK = re.compile(r"^```python\n(?P<code>.*?)^```", flags=re.S | re.M)
PAGES = sorted(p.name for p in DOCS.glob("*.md"))


def python_blocks(text: str) -> list[tuple[int, str, str | None]]:
    """(line, code, reason to skip or None) of every ```python block of a page, in order."""
    out = []
    for match in BLOCK.finditer(text):
        before = text[:match.start()]
        last_line = before[before.rfind("\n", 0, len(before) - 1) + 1:]
        skip = SKIP_MARK.match(last_line)
        out.append((before.count("\n") + 1, match["code"], skip["why"] if skip else None))
    return out


def test_every_page_is_checked_and_marks_are_well_formed():
    assert {"guide.md", "analyses.md", "checkpoints.md"} <= set(PAGES)
    for name in PAGES:
        text = (DOCS / name).read_text()
        # other spellings of a Python fence would escape the runner
        assert not re.search(r"^```(py|python3|Python)\s*$", text, flags=re.M), name
        marks = text.count("docs-test")
        skipped = sum(why is not None for _, _, why in python_blocks(text))
        assert marks == skipped, (f"docs/{name}: a docs-test mark must sit on the line right "
                                  "above a ```python block and give its reason in parentheses")


@pytest.mark.parametrize("name", PAGES)
def test_python_blocks_of_every_page_run_in_order(name, monkeypatch):
    """Each page's Python blocks form one script (run from the repository root, as the docs'
    paths assume): they must run and their asserts hold. A block that cannot run here carries
    a skip mark with its reason."""
    import torch

    torch.manual_seed(0)
    monkeypatch.chdir(DOCS.parent)
    blocks = python_blocks((DOCS / name).read_text())
    if name == "guide.md":
        assert len(blocks) >= 5
    namespace: dict = {}
    for line, code, why in blocks:
        if why is not None:
            continue
        filename = f"docs/{name}:{line}"
        # nnsight re-reads the source of a `with model.trace(...)` body: register it as a file
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        try:
            exec(compile(code, filename, "exec"), namespace)
        except Exception as err:  # name the failing block
            raise AssertionError(
                f"docs/{name} python block at line {line} failed: {err!r}\n{code}") from err


def test_an_unmarked_failing_block_fails_and_a_mark_needs_a_reason():
    page = "text\n```python\nraise RuntimeError\n```\n"
    [(line, code, why)] = python_blocks(page)
    assert (line, why) == (2, None) and "RuntimeError" in code
    marked = "<!-- docs-test: skip (needs a GPU) -->\n```python\nx\n```\n"
    assert python_blocks(marked)[0][2] == "needs a GPU"
    assert python_blocks("<!-- docs-test: skip () -->\n```python\nx\n```\n")[0][2] is None


def test_the_benchmarks_overview_points_at_sections_that_exist():
    """docs/benchmarks.md opens with a table of where each kernel target stands; its last column
    names the sections that hold each figure's method, and a renamed section must not leave it
    pointing nowhere."""
    text = (DOCS / "benchmarks.md").read_text()
    start = text.index("\n## Fused kernels against issues 57 and 58")
    overview = text[start:text.index("\n## ", start + 1)]
    headings = [line[3:] for line in text.splitlines() if line.startswith("## ")]
    rows = [line for line in overview.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) > 10, "the overview's table is missing"
    for row in rows[1:]:
        for name in row.strip("| ").split(" | ")[-1].split("; "):
            if name in ("same", "each section's \"Tests\""):
                continue
            assert any(h.startswith(name) for h in headings), f"no section {name!r}: {row}"
