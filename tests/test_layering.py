"""Imports follow DESIGN.md's one-way floors: kernels <- hooked_models <- interp <- dashboards.

Every import statement is checked, including those inside functions (a lazy import is still a
dependency); a lower floor naming a higher one fails with the file, line and import.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FLOORS = ("kernels", "hooked_models", "interp", "dashboards")


def imported_packages(source: str, filename: str) -> list[tuple[int, str]]:
    """(line, top-level package) of every absolute import in `source`."""
    found = []
    for node in ast.walk(ast.parse(source, filename=filename)):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name.split(".")[0]) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
    return found


def back_edges(root: Path) -> list[str]:
    problems = []
    for floor, package in enumerate(FLOORS):
        for path in sorted((root / package).rglob("*.py")):
            if ".venv" in path.parts:
                continue
            for line, target in imported_packages(path.read_text(encoding="utf-8"), str(path)):
                if target in FLOORS and FLOORS.index(target) > floor:
                    problems.append(f"{path.relative_to(root)}:{line} imports {target}")
    return problems


def test_no_package_imports_a_higher_floor():
    assert back_edges(ROOT) == []


def test_importing_the_model_does_not_import_triton():
    """The model imports the plain references (`kernels.*.naive`) only: triton (and its
    interpreter mode, read once at import) is loaded by the first fused call, not before."""
    code = ("import sys, hooked_models\n"
            "from hooked_models.attention import _cope_reference, _infini_memory\n"
            "print(sorted(m for m in sys.modules if m == 'triton' or m.startswith('kernels.')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "['kernels.cope', 'kernels.cope.naive', 'kernels.infini', " \
                          "'kernels.infini.naive']"


def test_the_scan_catches_back_edges_lazy_ones_included(tmp_path):
    for package in FLOORS:
        (tmp_path / package).mkdir()
    (tmp_path / "kernels" / "k.py").write_text("import hooked_models.model\n")
    (tmp_path / "hooked_models" / "h.py").write_text(
        "import torch\n\ndef f():\n    from interp.tasks import induction\n")
    (tmp_path / "interp" / "i.py").write_text("from dashboards import app\nfrom . import x\n")
    (tmp_path / "dashboards" / "d.py").write_text("import interp, kernels\n")
    assert back_edges(tmp_path) == ["kernels/k.py:1 imports hooked_models",
                                    "hooked_models/h.py:4 imports interp",
                                    "interp/i.py:1 imports dashboards"]


@pytest.mark.parametrize("package", FLOORS)
def test_every_floor_is_scanned(package):
    assert any((ROOT / package).rglob("*.py")), package
