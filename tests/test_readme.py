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
    from attnlens.hooked_models import zoo

    for name in re.findall(r"'(induction-[a-z]+)'", README.read_text()):
        assert name in zoo.available()


def test_the_bundled_models_section_shows_the_text_models_first():
    """Issue 26 item 6: the README's first bundled model is a text language model, and every
    text model it names in a Python example is in the zoo."""
    from attnlens.hooked_models import zoo

    text = README.read_text()
    first = re.search(r'zoo\.load\("([^"]+)"\)', text).group(1)
    assert first in zoo.available(kind="text-lm")
    named = re.findall(r"'(text-[a-z0-9-]+)'", text)
    assert named and all(name in zoo.available(kind="text-lm") for name in named)


def test_the_text_model_listing_is_the_zoo_now():
    """The README's `zoo.available(kind="text-lm")` example shows exactly what that call
    returns: no model missing, none that is not shipped."""
    from attnlens.hooked_models import zoo

    text = README.read_text()
    listing = re.search(r'zoo\.available\(kind="text-lm"\)\n((?:#.*\n)+)', text)
    assert listing, "README lost its zoo.available(kind=\"text-lm\") example"
    shown = re.findall(r"'(text-[a-z0-9-]+)'", listing.group(1))
    assert shown == zoo.available(kind="text-lm")
