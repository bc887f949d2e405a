"""The README's first Python example runs as written."""

import re
from pathlib import Path

README = Path(__file__).parent.parent / "README.md"


def test_first_example_runs(capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README has no python example"
    namespace = {}
    exec(compile(blocks[0], "README.md", "exec"), namespace)
    assert "hook_pre_sm_conv" in capsys.readouterr().out
    assert namespace["cache"]["pattern", 0].shape[-1] == len("the cat sat. the cat sat.") + 1


def test_zoo_example_names_exist():
    from hooked_models import zoo

    for name in re.findall(r"'(induction-[a-z]+)'", README.read_text()):
        assert name in zoo.available()
