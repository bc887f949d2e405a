"""The `attnlens` command line: demo and stages (analyze and serve are tested elsewhere)."""

from attnlens.cli import main
from attnlens.hooked_models import available_variants


def test_demo_prints_head_table_and_ablation(capsys):
    assert main(["demo", "--steps", "3"]) == 0
    out = capsys.readouterr().out
    assert "Head table" in out and "L1H3" in out and "Knocking out L0H" in out
    assert "accuracy" in out


def test_stages_lists_every_variant(capsys):
    assert main(["stages"]) == 0
    out = capsys.readouterr().out
    for name in available_variants():
        assert f"\n{name}:" in out
    assert "hook_pattern" in out
    assert "neither" not in out
    gates = next(line for line in out.splitlines() if "hook_gates" in line)
    assert "not softmax" in gates and "pre-softmax" not in gates


def test_help_describes_every_command():
    """The top-level help (the module docstring) has a usage line for each subcommand."""
    import argparse

    import attnlens.cli as cli

    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name in sub.choices:
        assert f"\n    attnlens {name}" in cli.__doc__, name
