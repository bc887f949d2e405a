"""The generated docs (docs/hooks.md, docs/cli.md) are current, and the guide's code runs."""

import re
from pathlib import Path

import pytest

from dashboards import docs_gen
from hooked_models import available_variants

DOCS = Path(__file__).resolve().parent.parent / "docs"


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
    assert "docs/hooks.md is stale; refresh it with `python -m dashboards.docs_gen`" in (
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
    from dashboards.cli import build_parser

    text = (DOCS / "cli.md").read_text()
    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    for name, parser in sub.choices.items():
        assert f"## attnlens {name}" in text
        for action in parser._actions:
            for flag in action.option_strings:
                assert flag in text, (name, flag)


def _guide_blocks() -> list[str]:
    text = (DOCS / "guide.md").read_text()
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_guide_python_blocks_run_in_order():
    """docs/guide.md's Python blocks form one script: they must run and their asserts hold."""
    import torch

    torch.manual_seed(0)
    blocks = _guide_blocks()
    assert len(blocks) >= 5
    namespace: dict = {}
    for i, block in enumerate(blocks):
        try:
            exec(compile(block, f"docs/guide.md block {i}", "exec"), namespace)
        except Exception as err:  # name the failing block
            raise AssertionError(
                f"docs/guide.md python block {i} failed: {err!r}\n{block}") from err
