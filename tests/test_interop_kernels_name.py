"""Our import package `kernels` shares its name with Hugging Face's `kernels` distribution
(issue 21): a shadowed attnlens says what to do, and a shadowed Hugging Face package warns."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(code: str, pythonpath: list[Path]) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(str(p) for p in pythonpath))
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=pythonpath[0],
                          capture_output=True, text=True, timeout=120)


def test_hugging_face_kernels_first_on_the_path_is_refused_with_advice(tmp_path):
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "__init__.py").write_text("def get_kernel(name): ...\n")
    out = _run("import hooked_models", [tmp_path, ROOT])
    assert out.returncode != 0
    assert "ImportError" in out.stderr and "is not attnlens's kernels package" in out.stderr
    assert "pip uninstall kernels" in out.stderr


def test_an_installed_hugging_face_kernels_distribution_is_reported(tmp_path):
    info = tmp_path / "kernels-0.9.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kernels\nVersion: 0.9.0\n")
    code = ("import warnings; warnings.simplefilter('always')\n"
            "import kernels; assert kernels.__attnlens__")
    out = _run(code, [ROOT, tmp_path])
    assert out.returncode == 0, out.stderr
    assert "the distribution 'kernels' 0.9.0" in out.stderr
    assert "separate environments" in out.stderr
    clean = _run("import warnings; warnings.simplefilter('error'); import kernels", [ROOT])
    assert clean.returncode == 0, clean.stderr
