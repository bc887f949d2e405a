"""Imports follow the one-way floors of docs/design.md: kernels <- hooked_models <- interp <-
dashboards <- attnlens (the production line: CLI, training, zoo recipes, reports, benchmarks).

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
FLOORS = ("kernels", "hooked_models", "interp", "dashboards", "attnlens")
LIBRARY = FLOORS[:-1]   # what researchers import; never the production line


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
    """The model imports the plain references (`kernels.<op>.reference`, the one spec of each op)
    only: triton (and its interpreter mode, read once at import) is loaded by the first fused
    call, not before."""
    code = ("import sys, hooked_models\n"
            "from hooked_models.attention import cope, infini, mta, dcmha, mha\n"
            "print(sorted(m for m in sys.modules if m == 'triton' or m.startswith('kernels.')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    loaded = eval(out)   # a printed list of module names
    assert "triton" not in loaded
    assert all(m.endswith(".reference") or m.count(".") == 1 for m in loaded), loaded


def test_no_library_package_imports_the_production_line():
    problems = [edge for edge in back_edges(ROOT) if edge.endswith("imports attnlens")]
    assert problems == []
    assert "attnlens" not in LIBRARY


VARIANT_FILES = {"layer.py"}          # each variant folder: its layer, plus options / ops as needed
ATTENTION_INFRASTRUCTURE = {"__init__.py", "base.py", "registry.py", "observe.py", "options.py"}


def test_each_variant_lives_in_its_own_folder():
    """`hooked_models/attention/<variant>/` holds a registered variant's layer, options and ops;
    the attention package itself holds only the shared infrastructure."""
    from hooked_models.attention import available_variants, get_attention_class

    attention = ROOT / "hooked_models" / "attention"
    flat = {p.name for p in attention.glob("*.py")}
    assert flat == ATTENTION_INFRASTRUCTURE
    for name in available_variants():
        folder = attention / name
        assert VARIANT_FILES <= {p.name for p in folder.glob("*.py")}, name
        assert get_attention_class(name).__module__ == f"hooked_models.attention.{name}.layer"
    folders = {p.name for p in attention.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == set(available_variants())


def test_one_specification_per_kernel_op():
    """Every kernels/<op>/ has one plain-torch spec, `reference.py`, and no second one."""
    ops = [p for p in (ROOT / "kernels").iterdir() if (p / "function.py").is_file()]
    assert len(ops) >= 5
    for op in ops:
        assert (op / "reference.py").is_file(), op.name
        assert not (op / "naive.py").exists(), op.name


def test_no_alias_shims():
    """No module stands in for another by rewriting `sys.modules` (the old plot aliases)."""
    shims = [str(p.relative_to(ROOT)) for package in FLOORS
             for p in (ROOT / package).rglob("*.py")
             if "sys.modules[__name__]" in p.read_text(encoding="utf-8")]
    assert shims == []


def test_the_console_script_is_the_production_lines():
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert 'attnlens = "attnlens.cli:main"' in text


def test_the_scan_catches_back_edges_lazy_ones_included(tmp_path):
    for package in FLOORS:
        (tmp_path / package).mkdir()
    (tmp_path / "kernels" / "k.py").write_text("import hooked_models.model\n")
    (tmp_path / "hooked_models" / "h.py").write_text(
        "import torch\n\ndef f():\n    from interp.tasks import induction\n")
    (tmp_path / "interp" / "i.py").write_text("from dashboards import app\nfrom . import x\n")
    (tmp_path / "dashboards" / "d.py").write_text("import interp, kernels\n"
                                                  "from attnlens.cli import main\n")
    (tmp_path / "attnlens" / "a.py").write_text("import dashboards, hooked_models\n")
    assert back_edges(tmp_path) == ["kernels/k.py:1 imports hooked_models",
                                    "hooked_models/h.py:4 imports interp",
                                    "interp/i.py:1 imports dashboards",
                                    "dashboards/d.py:2 imports attnlens"]


@pytest.mark.parametrize("package", FLOORS)
def test_every_floor_is_scanned(package):
    assert any((ROOT / package).rglob("*.py")), package
