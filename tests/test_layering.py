"""Imports follow the one-way floors of docs/design.md: attnlens.kernels <- attnlens.hooked_models
<- attnlens.interp <- attnlens.dashboards <- the production line (attnlens.cli, .training, .lab,
.reports, .bench, .benchmarks), and everything is imported under `attnlens` (issue 54): the old
top-level names (`kernels`, `hooked_models`, `interp`, `dashboards`) are imported nowhere.

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
FLOORS = ("kernels", "hooked_models", "interp", "dashboards", "attnlens")   # repository folders
LIBRARY = FLOORS[:-1]   # what researchers import; never the production line
PRODUCTION = len(FLOORS) - 1
OLD_NAMES = set(LIBRARY)   # top-level names before issue 54
SCANNED = ("tests", "scripts", "notebooks")   # besides the floors: nothing there imports old names


def imported_modules(source: str, filename: str) -> list[tuple[int, str]]:
    """(line, dotted module) of every absolute import in `source`; `from attnlens import x` gives
    `attnlens.x` for each name."""
    found = []
    for node in ast.walk(ast.parse(source, filename=filename)):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "attnlens":
                found.extend((node.lineno, f"attnlens.{alias.name}") for alias in node.names)
            else:
                found.append((node.lineno, node.module))
    return found


def floor_of(module: str) -> int | None:
    """The floor an imported module belongs to; None for a module that is not ours."""
    parts = module.split(".")
    if parts[0] != "attnlens":
        return None
    if len(parts) > 1 and parts[1] in LIBRARY:
        return LIBRARY.index(parts[1])
    return PRODUCTION   # the production line, or the top-level package's everyday names


def back_edges(root: Path) -> list[str]:
    problems = []
    for floor, package in enumerate(FLOORS):
        for path in sorted((root / package).rglob("*.py")):
            if ".venv" in path.parts:
                continue
            for line, module in imported_modules(path.read_text(encoding="utf-8"), str(path)):
                target = floor_of(module)
                if target is not None and target > floor:
                    problems.append(f"{path.relative_to(root)}:{line} imports {module}")
    return problems


def old_name_imports(root: Path) -> list[str]:
    problems = []
    for folder in (*FLOORS, *SCANNED):
        for path in sorted((root / folder).rglob("*.py")):
            if ".venv" in path.parts:
                continue
            for line, module in imported_modules(path.read_text(encoding="utf-8"), str(path)):
                if module.split(".")[0] in OLD_NAMES:
                    problems.append(f"{path.relative_to(root)}:{line} imports {module}")
    return problems


def test_no_package_imports_a_higher_floor():
    assert back_edges(ROOT) == []


def test_nothing_imports_the_old_top_level_names():
    assert old_name_imports(ROOT) == []


def test_setup_maps_every_floor_into_the_namespace():
    """setup.py's packages are `attnlens` and its subpackages only, each floor's folder mapped."""
    code = ("import runpy, setuptools, json\n"
            "seen = {}\n"
            "setuptools.setup = lambda **kw: seen.update(kw)\n"
            "runpy.run_path('setup.py')\n"
            "print(json.dumps([seen['packages'], seen['package_dir']]))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    import json

    packages, package_dir = json.loads(out)
    assert all(p == "attnlens" or p.startswith("attnlens.") for p in packages)
    for floor in LIBRARY:
        assert package_dir[f"attnlens.{floor}"] == floor
        on_disk = {str(p.parent.relative_to(ROOT)).replace("/", ".")
                   for p in (ROOT / floor).rglob("__init__.py")}
        assert {f"attnlens.{p}" for p in on_disk} <= set(packages), floor


def test_importing_the_model_does_not_import_triton():
    """The model imports the plain references (`kernels.<op>.reference`, the one spec of each op)
    only: triton (and its interpreter mode, read once at import) is loaded by the first fused
    call, not before."""
    code = ("import sys, attnlens.hooked_models\n"
            "from attnlens.hooked_models.attention import cope, infini, mta, dcmha, mha\n"
            "print(sorted(m for m in sys.modules\n"
            "             if m == 'triton' or m.startswith('attnlens.kernels.')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    loaded = eval(out)   # a printed list of module names
    assert "triton" not in loaded
    assert all(m.endswith(".reference") or m.count(".") == 2 for m in loaded), loaded


def test_no_library_package_imports_the_production_line():
    problems = [edge for edge in back_edges(ROOT)
                if floor_of(edge.rsplit(" ", 1)[1]) == PRODUCTION]
    assert problems == []
    assert "attnlens" not in LIBRARY


VARIANT_FILES = {"layer.py"}          # each variant folder: its layer, plus options / ops as needed
ATTENTION_INFRASTRUCTURE = {"__init__.py", "base.py", "registry.py", "observe.py", "options.py",
                            "pattern_heads.py"}


def test_each_variant_lives_in_its_own_folder():
    """`hooked_models/attention/<variant>/` holds a registered variant's layer, options and ops;
    the attention package itself holds only the shared infrastructure."""
    from attnlens.hooked_models.attention import available_variants, get_attention_class

    attention = ROOT / "hooked_models" / "attention"
    flat = {p.name for p in attention.glob("*.py")}
    assert flat == ATTENTION_INFRASTRUCTURE
    for name in available_variants():
        folder = attention / name
        assert VARIANT_FILES <= {p.name for p in folder.glob("*.py")}, name
        module = get_attention_class(name).__module__
        assert module == f"attnlens.hooked_models.attention.{name}.layer"
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
    (tmp_path / "kernels" / "k.py").write_text("import attnlens.hooked_models.model\n")
    (tmp_path / "hooked_models" / "h.py").write_text(
        "import torch\n\ndef f():\n    from attnlens.interp.tasks import induction\n")
    (tmp_path / "interp" / "i.py").write_text("from attnlens import dashboards\nfrom . import x\n")
    (tmp_path / "dashboards" / "d.py").write_text("import attnlens.interp, attnlens.kernels\n"
                                                  "from attnlens.cli import main\n"
                                                  "from attnlens import zoo\n")
    (tmp_path / "attnlens" / "a.py").write_text("import attnlens.dashboards, attnlens.kernels\n")
    assert back_edges(tmp_path) == ["kernels/k.py:1 imports attnlens.hooked_models.model",
                                    "hooked_models/h.py:4 imports attnlens.interp.tasks",
                                    "interp/i.py:1 imports attnlens.dashboards",
                                    "dashboards/d.py:2 imports attnlens.cli",
                                    "dashboards/d.py:3 imports attnlens.zoo"]


def test_the_scan_catches_old_names(tmp_path):
    for folder in (*FLOORS, *SCANNED):
        (tmp_path / folder).mkdir()
    (tmp_path / "tests" / "t.py").write_text("import kernels.mta\n")
    (tmp_path / "interp" / "i.py").write_text("def f():\n    from hooked_models import zoo\n")
    (tmp_path / "attnlens" / "a.py").write_text("import attnlens.interp\n")
    assert old_name_imports(tmp_path) == ["interp/i.py:2 imports hooked_models",
                                          "tests/t.py:1 imports kernels.mta"]


@pytest.mark.parametrize("package", FLOORS)
def test_every_floor_is_scanned(package):
    assert any((ROOT / package).rglob("*.py")), package
