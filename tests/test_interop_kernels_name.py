"""Every module of ours lives under `attnlens` (issue 54): a top-level `kernels` package (Hugging
Face's kernel hub has that import name) first on the path changes nothing for attnlens, and
attnlens changes nothing for it. The installed-wheel check beside the real distribution, in both
orders, is tests/test_wheel_install.py (reproduce tier)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(code: str, pythonpath: list[Path], cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(str(p) for p in pythonpath))
    return subprocess.run([sys.executable, "-W", "error", "-c", code], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def test_a_foreign_kernels_package_and_attnlens_import_side_by_side(tmp_path):
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "__init__.py").write_text("def get_kernel(name):\n    return name\n")
    code = ("import attnlens.hooked_models, attnlens.kernels.flash_attention, kernels\n"
            "assert kernels.get_kernel('x') == 'x', kernels.__file__\n"
            "import attnlens.kernels as ours\n"
            f"assert ours.__file__.startswith({str(ROOT)!r}), ours.__file__\n"
            "print('ok')")
    # cwd outside the repository, so only the path and the install decide
    out = _run(code, [tmp_path], cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_from_the_repository_root_the_top_level_name_is_the_other_package(tmp_path):
    """A process started in the repository root has the root on sys.path, where the folder
    kernels/ (attnlens.kernels' source) would shadow Hugging Face's `kernels`, which
    transformers >= 5.25 imports: it hands the name over instead."""
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "__init__.py").write_text("def get_kernel(name):\n    return name\n")
    code = ("import kernels, attnlens.kernels as ours\n"
            "assert kernels.get_kernel('y') == 'y', kernels.__file__\n"
            f"assert ours.__file__ == {str(ROOT / 'kernels' / '__init__.py')!r}\n"
            "print(kernels.__file__)")
    out = _run(code, [tmp_path], cwd=ROOT)   # '' (the root) comes before PYTHONPATH
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(tmp_path / "kernels" / "__init__.py")


def test_from_the_repository_root_without_the_other_package_the_name_is_missing():
    out = subprocess.run([sys.executable, "-S", "-c", "import kernels"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0
    assert "ModuleNotFoundError: No module named 'kernels'" in out.stderr
    assert "attnlens.kernels" in out.stderr
