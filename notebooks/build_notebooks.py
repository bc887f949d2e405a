"""Build the notebooks from their sources in notebooks/src/ (one `.py` file each, percent format).

    python notebooks/build_notebooks.py --execute   # rebuild, run top to bottom, keep outputs
    python notebooks/build_notebooks.py --check     # exit 1 naming each notebook that is stale
    python notebooks/build_notebooks.py --execute 02_induction_heads   # just one

A source is plain Python: `# %%` opens a code cell, `# %% [markdown]` a markdown cell whose lines
are comments (`# ` stripped). The notebooks are committed with their outputs. Plotly figures are
stored twice in one output: the interactive JSON (JupyterLab) and a static PNG (GitHub, which
cannot draw plotly), through the renderer `plotly_mimetype+png` (PNG by kaleido, offline).
tests/test_notebooks.py checks that the committed notebooks match their sources and carry outputs,
and executes each one again.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent
SRC = HERE / "src"
REFRESH = "python notebooks/build_notebooks.py --execute"
# The kernel inherits the environment; plotly reads its default renderer from PLOTLY_RENDERER.
COMMIT_RENDERER = "plotly_mimetype+png"
MARKDOWN, CODE = "# %% [markdown]", "# %%"
# Run in each build kernel before the first cell (an IPython startup file): one headless Chrome
# for all of a notebook's PNGs (kaleido otherwise starts one per figure, ~6 s each).
KERNEL_STARTUP = """\
import os
import warnings

warnings.filterwarnings("ignore", message="The kopts argument is ignored")
warnings.filterwarnings("ignore", message="IProgress not found")
if "png" in os.environ.get("PLOTLY_RENDERER", ""):
    import kaleido

    kaleido.start_sync_server(silence_warnings=True)
"""


def parse(text: str, name: str = "source") -> list[tuple[str, str]]:
    """The cells of a percent-format source as (kind, source) pairs, kind "md" or "code"."""
    cells: list[tuple[str, list[str]]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.rstrip()
        if stripped == MARKDOWN:
            cells.append(("md", []))
        elif stripped == CODE:
            cells.append(("code", []))
        elif not cells:
            if stripped:
                raise ValueError(f"{name} line {number}: text before the first '# %%' marker")
        elif cells[-1][0] == "md":
            if stripped and not (stripped == "#" or stripped.startswith("# ")):
                raise ValueError(f"{name} line {number}: markdown lines must start with '# '")
            cells[-1][1].append(stripped[2:])
        else:
            cells[-1][1].append(line)
    out = []
    for kind, lines in cells:
        source = "\n".join(lines).strip("\n")
        if not source:
            raise ValueError(f"{name}: an empty {kind} cell")
        out.append((kind, source))
    return out


def sources() -> dict[str, Path]:
    """Notebook stem -> its source file."""
    return {p.stem: p for p in sorted(SRC.glob("*.py"))}


def notebook_from(source: Path) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    nb.cells = [nbformat.v4.new_markdown_cell(src) if kind == "md"
                else nbformat.v4.new_code_cell(src)
                for kind, src in parse(source.read_text(), source.name)]
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"cell-{i}"  # stable ids: rebuilding changes no line that did not change
    return nb


def execute(nb: nbformat.NotebookNode, renderer: str = COMMIT_RENDERER,
            timeout: int = 600) -> nbformat.NotebookNode:
    """Run `nb` top to bottom in a fresh kernel started in notebooks/ (raises on a failing
    cell); returns it with outputs, without per-run metadata (timings)."""
    from nbclient import NotebookClient

    saved = {k: os.environ.get(k) for k in ("PLOTLY_RENDERER", "PYTHONPATH", "TQDM_DISABLE",
                                             "IPYTHONDIR", "OMP_NUM_THREADS")}
    with tempfile.TemporaryDirectory() as ipython_dir:
        startup = Path(ipython_dir) / "profile_default" / "startup"
        startup.mkdir(parents=True)
        (startup / "00-build-notebooks.py").write_text(KERNEL_STARTUP)
        os.environ.update(PLOTLY_RENDERER=renderer, TQDM_DISABLE="1", IPYTHONDIR=ipython_dir)
        # One torch thread: inside a kernel, 2 threads on 2 busy cores ran 10x slower (spinning
        # threads fight the kernel's own); the outputs do not depend on it.
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        # Cells import the package from the repository root, also when it is not installed.
        os.environ["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(HERE.parent), saved["PYTHONPATH"]) if p)
        try:
            NotebookClient(nb, timeout=timeout, kernel_name="python3",
                           resources={"metadata": {"path": str(HERE)}}).execute()
        finally:
            _restore(saved)
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
    return nb


def _restore(saved: dict) -> None:
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def stale(directory: Path = HERE) -> list[str]:
    """What is out of date under `directory`: notebooks whose cells differ from their sources,
    code cells without outputs, notebooks without a source. Empty when all is current."""
    problems = []
    srcs = sources()
    for path in sorted(directory.glob("*.ipynb")):
        if path.stem not in srcs:
            problems.append(f"{path.name}: no source notebooks/src/{path.stem}.py")
    for stem, src in srcs.items():
        path = directory / f"{stem}.ipynb"
        if not path.is_file():
            problems.append(f"{path.name}: missing")
            continue
        nb = nbformat.read(str(path), as_version=4)
        want = [(c.cell_type, c.source) for c in notebook_from(src).cells]
        have = [(c.cell_type, c.source) for c in nb.cells]
        if want != have:
            problems.append(f"{path.name}: cells differ from notebooks/src/{src.name}")
        empty = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and not c.outputs]
        if empty:
            problems.append(f"{path.name}: code cells {empty} have no outputs")
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="notebook stems (default: all)")
    ap.add_argument("--execute", action="store_true", help="run them and keep their outputs")
    ap.add_argument("--check", action="store_true", help="only report what is stale (exit 1)")
    args = ap.parse_args(argv)
    if args.check:
        problems = stale()
        for p in problems:
            print(f"{p}; refresh with `{REFRESH}`")
        return 1 if problems else 0
    srcs = sources()
    unknown = [n for n in args.names if n not in srcs]
    if unknown:
        raise SystemExit(f"no notebook source for {unknown}; sources: {sorted(srcs)}")
    for stem in args.names or srcs:
        nb = notebook_from(srcs[stem])
        start = time.perf_counter()
        if args.execute:
            execute(nb)
        nbformat.write(nb, str(HERE / f"{stem}.ipynb"))
        print(f"wrote notebooks/{stem}.ipynb ({time.perf_counter() - start:.0f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
