"""Issue 54, the installed wheel beside Hugging Face's `kernels` (whose import name, `kernels`,
was once our top-level package): in a fresh venv, attnlens's wheel and the `kernels`
distribution install in both orders, `pip check` passes, both import and work, their file lists
are disjoint, and uninstalling either leaves the other whole.

Not in the fast tier nor in the reproduce tier (it downloads and installs packages for a few
minutes): `make install-check` runs it, and CI (.ci/run) runs that target.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.install, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[1]
TORCH = "torch==2.13.0"    # the CPU build scripts/setup.sh installs (no multi-GB CUDA build)

# what a user of each does first
ATTNLENS_WORKS = """
import attnlens, torch
cfg = attnlens.VariantConfig(d_model=32, d_head=8, n_layers=1, n_ctx=16, d_vocab=11,
                             attention="mta", seed=0)
model = attnlens.HookedVariantTransformer(cfg)
logits, cache = model.run_with_cache(torch.arange(8)[None])
assert logits.shape == (1, 8, 11) and cache["pattern", 0].shape == (1, 4, 8, 8)
import attnlens.kernels.mta.reference, attnlens.dashboards.app
print("attnlens ok")
"""
KERNELS_WORKS = """
import importlib.metadata as md, kernels
from kernels import get_kernel
files = {str(f.locate()) for f in md.distribution("kernels").files}
assert kernels.__file__ in files, kernels.__file__
print("kernels ok")
"""
FILES = """
import importlib.metadata as md, json, sys
print(json.dumps(sorted(str(f) for f in md.distribution(sys.argv[1]).files)))
"""


class Venv:
    def __init__(self, path: Path):
        subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
        self.python = str(path / "bin" / "python")

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        out = subprocess.run([self.python, *args], capture_output=True, text=True, env=env,
                             cwd="/", timeout=1200)
        if check and out.returncode != 0:
            raise AssertionError(f"{' '.join(args[:4])}... failed:\n{out.stdout}\n{out.stderr}")
        return out

    def pip(self, *args: str) -> subprocess.CompletedProcess:
        return self.run("-m", "pip", "-q", *args)

    def files(self, dist: str) -> set[str]:
        return set(json.loads(self.run("-c", FILES, dist).stdout))

    def both_work(self) -> None:
        assert self.run("-m", "pip", "check").returncode == 0
        assert self.run("-c", ATTNLENS_WORKS).stdout.strip() == "attnlens ok"
        assert self.run("-c", KERNELS_WORKS).stdout.strip() == "kernels ok"
        ours, theirs = self.files("attnlens"), self.files("kernels")
        assert ours and theirs and not ours & theirs, sorted(ours & theirs)[:5]
        scripts = sorted(f for f in ours if f.startswith("../"))
        assert scripts == ["../../../bin/attnlens"], scripts   # the console script
        assert {f.split("/")[0] for f in ours if not f.startswith("../")} == {
            "attnlens", "attnlens-0.1.0.dist-info"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out),
                    str(ROOT)], check=True, capture_output=True, timeout=600)
    (whl,) = out.glob("attnlens-*.whl")
    return whl


def test_beside_hugging_face_kernels_in_both_orders(tmp_path, wheel):
    venv = Venv(tmp_path / "venv")
    venv.pip("install", TORCH)
    # order 1: Hugging Face's kernels first, then attnlens (current transformers, no pin)
    venv.pip("install", "kernels")
    venv.pip("install", str(wheel))
    venv.both_work()
    kernels_files = venv.files("kernels")
    venv.pip("uninstall", "-y", "attnlens")
    assert venv.run("-c", KERNELS_WORKS).stdout.strip() == "kernels ok"
    assert venv.files("kernels") == kernels_files
    # order 2: attnlens first, then Hugging Face's kernels (reinstalled over nothing of ours)
    venv.pip("uninstall", "-y", "kernels")
    venv.pip("install", str(wheel))
    attnlens_files = venv.files("attnlens")
    venv.pip("install", "--force-reinstall", "--no-deps", "kernels")
    venv.both_work()
    venv.pip("uninstall", "-y", "kernels")
    assert venv.run("-c", ATTNLENS_WORKS).stdout.strip() == "attnlens ok"
    assert venv.files("attnlens") == attnlens_files
    assert venv.run("-c", "import kernels", check=False).returncode != 0
