"""scripts/gpu_tree.sh (issue 57 item 4): a device call sends at most 64 MiB of working tree and
the zoo's weights are ~150 MiB, so `hide` takes the model folders out of the working tree before
the call (a sparse checkout: nothing staged, status clean) and `restore` brings every one back."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(),
                                reason="needs git and a git checkout")


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True,
                          check=True).stdout


def _tree(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "scripts/gpu_tree.sh", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300)


@pytest.fixture
def clone(tmp_path):
    dst = tmp_path / "clone"
    _git(ROOT, "clone", "-q", "--local", str(ROOT), str(dst))
    shutil.copy2(ROOT / "scripts" / "gpu_tree.sh", dst / "scripts" / "gpu_tree.sh")
    yield dst
    shutil.rmtree(dst, ignore_errors=True)   # a checkout with the zoo: ~350 MB of CI's disk


def test_hide_leaves_the_models_behind_and_restore_brings_them_back(clone):
    models = sorted(p.name for p in (clone / "hooked_models" / "zoo").iterdir() if p.is_dir())
    assert len(models) > 10
    before = _git(clone, "status", "--porcelain")
    out = _tree(clone, "hide")
    assert out.returncode == 0, out.stderr
    mib = float(out.stdout.split("; ")[1].split(" MiB")[0])
    assert mib < 64
    assert not [p for p in (clone / "hooked_models" / "zoo").iterdir() if p.is_dir()]
    assert (clone / "hooked_models" / "zoo" / "__init__.py").is_file()   # the loader stays
    assert _git(clone, "status", "--porcelain") == before   # nothing staged or deleted
    out = _tree(clone, "restore")
    assert out.returncode == 0, out.stderr
    assert sorted(p.name for p in (clone / "hooked_models" / "zoo").iterdir()
                  if p.is_dir()) == models
    assert _git(clone, "status", "--porcelain") == before


def test_hide_refuses_untracked_files_in_the_zoo(clone):
    run = clone / "hooked_models" / "zoo" / "text-new-l9"
    run.mkdir()
    (run / "config.json").write_text("{}")
    out = _tree(clone, "hide")
    assert out.returncode == 2 and "untracked files" in out.stderr
    assert (run / "config.json").is_file()
