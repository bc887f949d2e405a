"""A study figure's Markdown image link, relative to the page that shows it (docs/zoo.md)."""

from __future__ import annotations

import os
from pathlib import Path


def figure_markdown(studies: Path, out: Path, name: str) -> str:
    """`![name](path)` for `studies/name.png`, the path relative to the page `out`; "" when the
    figure was not drawn (e.g. without kaleido)."""
    png = studies / f"{name}.png"
    if not png.is_file():
        return ""
    rel = os.path.relpath(png.resolve(), out.resolve().parent)
    return f"\n![{name}]({Path(rel).as_posix()})\n"
