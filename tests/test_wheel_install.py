"""Issue 54, the installed wheel beside Hugging Face's `kernels` (whose import name, `kernels`,
was once our top-level package): in a fresh venv, attnlens's wheel and the `kernels`
distribution install in both orders, `pip check` passes, both import and work, their file lists
are disjoint, and uninstalling either leaves the other whole.

Not in the fast tier nor in the reproduce tier (it downloads and installs packages for a few
minutes): `make install-check` runs it, and CI (.ci/run) runs that target.

Disk: the venv would hold 2.7 GB, and CI once ran out of space in it (stop 65, "[Errno 28] No
space left on device" after the fast tier). So torch and triton, the two largest distributions
(1.75 GB), are hard-linked into it from the running environment, file by file from their RECORD
(copied where a link cannot be made): pip sees them installed, as a user's torch is, and resolves
everything else from the index as before. Nothing goes to pip's cache, the venv is removed when
the test ends, and the test stops before installing anything when the disk has less room than
what is left to install.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.install, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[1]
TORCH = "torch==2.13.0"    # the CPU build scripts/setup.sh installs (no multi-GB CUDA build)
SEEDED = ("torch", "triton")   # hard-linked from the running environment (module docstring)
NEEDS_FREE = 1.5e9             # what pip still installs after the seeding (1.0 GB seen) + margin

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

    @property
    def site_packages(self) -> Path:
        return Path(self.run("-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])")
                    .stdout.strip())

    def seed(self, dist: str) -> int:
        """Hard-link (or copy) the running environment's installed `dist` into this venv, every
        file its RECORD lists inside site-packages; returns the number of files."""
        installed = md.distribution(dist)
        site = self.site_packages
        count = 0
        for entry in installed.files or ():
            if str(entry).startswith(".."):    # console scripts name the running venv's python
                continue
            source, target = Path(installed.locate_file(entry)), site / entry
            if not source.is_file():
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(source, target)
            except OSError:
                shutil.copy2(source, target)
            count += 1
        return count

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        env["PIP_NO_CACHE_DIR"] = "1"
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


@pytest.fixture
def venv(tmp_path):
    free = shutil.disk_usage(tmp_path).free
    if free < NEEDS_FREE:
        pytest.fail(f"install-check needs about {NEEDS_FREE / 1e9:.1f} GB free under {tmp_path} "
                    f"for its venv; {free / 1e9:.2f} GB are free")
    made = Venv(tmp_path / "venv")
    yield made
    shutil.rmtree(tmp_path / "venv", ignore_errors=True)


def test_seeded_distributions_are_the_pinned_ones(venv):
    """The seeding gives the venv torch and triton that pip accepts as installed, at the
    versions setup.sh pins, sharing the running environment's files (no second copy)."""
    for dist in SEEDED:
        assert venv.seed(dist) > 100, dist
    versions = json.loads(venv.run("-c", "import importlib.metadata as md, json; print(json.dumps("
                                   f"{{d: md.version(d) for d in {SEEDED!r}}}))").stdout)
    assert versions == {d: md.version(d) for d in SEEDED}
    assert versions["torch"].split("+")[0] == TORCH.split("==")[1]
    out = venv.run("-m", "pip", "install", "--no-deps", "--dry-run", TORCH)
    assert "Would install" not in out.stdout, out.stdout
    ours = Path(md.distribution("torch").locate_file("torch/__init__.py"))
    seeded = venv.site_packages / "torch" / "__init__.py"
    assert seeded.read_bytes() == ours.read_bytes()
    if seeded.stat().st_dev == ours.stat().st_dev:    # one file system: a link, no second copy
        assert seeded.stat().st_ino == ours.stat().st_ino


def test_beside_hugging_face_kernels_in_both_orders(venv, wheel):
    for dist in SEEDED:
        venv.seed(dist)
    venv.pip("install", TORCH)    # already there: installs nothing more
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
