"""Issue 54: the library's wheel holds `attnlens/` and its dist-info only and no model; the
bundled models are the `attnlens-zoo` wheel (scripts/build_zoo_wheel.py), which the zoo loader
finds wherever it is installed, and says how to get when it is absent. The installed-wheel check
beside Hugging Face's `kernels` is tests/test_wheel_install.py (`make install-check`)."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import re
import shutil
import subprocess
import sys
import types
import zipfile
from pathlib import Path

import pytest

from attnlens.hooked_models import zoo
from scripts import build_zoo_wheel

ROOT = Path(__file__).resolve().parents[1]
MAX_LIBRARY_WHEEL = 5 * 2**20    # "a few MB"; it is under 1 MiB today


def _record(whl: Path) -> list[list[str]]:
    with zipfile.ZipFile(whl) as zf:
        info = next(n for n in zf.namelist() if n.endswith(".dist-info/RECORD"))
        return list(csv.reader(io.StringIO(zf.read(info).decode())))


def _copy_tree(dst: Path) -> Path:
    """The repository's sources (models included, so their exclusion is what is tested)."""
    ignore = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "out",
                                    "__pycache__", ".pytest_cache", ".ruff_cache")

    def link_or_copy(src, dst_file):
        try:
            Path(dst_file).hardlink_to(src)
        except OSError:
            shutil.copy2(src, dst_file)

    shutil.copytree(ROOT, dst, ignore=ignore, copy_function=link_or_copy)
    return dst


@pytest.fixture(scope="module")
def library_wheel(tmp_path_factory) -> Path:
    src = _copy_tree(tmp_path_factory.mktemp("src") / "attnlens")
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out),
                    str(src)], check=True, capture_output=True, timeout=600)
    (whl,) = out.glob("attnlens-*.whl")
    return whl


def test_the_library_wheel_holds_attnlens_alone_and_no_model(library_wheel):
    rows = _record(library_wheel)
    tops = {row[0].split("/")[0] for row in rows}
    version = build_zoo_wheel.project_version()
    assert tops == {"attnlens", f"attnlens-{version}.dist-info"}
    names = {row[0] for row in rows}
    assert not any(n.endswith(".safetensors") for n in names)
    assert not any(n.startswith("attnlens/hooked_models/zoo/") and n.count("/") > 3
                   for n in names), "a model folder rode in the library wheel"
    # every floor is there, mapped under attnlens, with the data files the code reads
    for module in ("attnlens/kernels/mta/reference.py", "attnlens/hooked_models/model.py",
                   "attnlens/hooked_models/zoo/__init__.py", "attnlens/interp/tools/heads.py",
                   "attnlens/dashboards/app.py", "attnlens/dashboards/assets/tokens.js",
                   "attnlens/lab/package_pins.json", "attnlens/cli.py"):
        assert module in names, module
    assert library_wheel.stat().st_size < MAX_LIBRARY_WHEEL


def test_a_checkout_imports_its_own_floors(tmp_path):
    """From a copy of the repository (another checkout, a worktree) its own folders are the
    floors, whichever editable install is active."""
    copy = _copy_tree(tmp_path / "other-checkout")
    code = ("import attnlens.kernels.mta.reference as r, attnlens.hooked_models as h, "
            "attnlens.lab as lab\nprint(r.__file__, h.__file__, lab.__file__)")
    out = subprocess.run([sys.executable, "-c", code], cwd=copy, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    files = out.stdout.split()
    assert files == [str(copy / "kernels" / "mta" / "reference.py"),
                     str(copy / "hooked_models" / "__init__.py"),
                     str(copy / "attnlens" / "lab" / "__init__.py")]


def test_the_zoo_extra_names_this_version():
    text = (ROOT / "pyproject.toml").read_text()
    assert f'zoo = ["attnlens-zoo=={build_zoo_wheel.project_version()}"]' in text
    assert "transformers>=4.40,<" not in text   # no pin against Hugging Face's kernels


def test_the_zoo_wheel_is_the_models_with_a_valid_record(tmp_path):
    whl = build_zoo_wheel.build(tmp_path, names=["induction-mha", "text-mha-l1"])
    assert whl.name == f"attnlens_zoo-{build_zoo_wheel.project_version()}-py3-none-any.whl"
    with zipfile.ZipFile(whl) as zf:
        rows = _record(whl)
        listed = {row[0] for row in rows}
        assert listed == set(zf.namelist())
        for name, digest, size in rows:
            if name.endswith("RECORD"):
                assert digest == size == ""
                continue
            data = zf.read(name)
            algo, b64 = digest.split("=", 1)
            assert algo == "sha256" and int(size) == len(data)
            assert base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=") \
                == b64.encode()
        metadata = zf.read(next(n for n in listed if n.endswith("METADATA"))).decode()
    assert re.search(r"^Name: attnlens-zoo$", metadata, re.M)
    tops = {n.split("/")[0] for n in listed}
    assert tops == {"attnlens_zoo", "attnlens_zoo-" + build_zoo_wheel.project_version()
                    + ".dist-info"}
    models = {n.split("/")[1] for n in listed if n.count("/") >= 2 and n[0] != "."}
    assert {"induction-mha", "text-mha-l1"} <= models
    assert "attnlens_zoo/induction-mha/model.safetensors" in listed
    # the same models give the same bytes
    again = build_zoo_wheel.build(tmp_path / "again", names=["induction-mha", "text-mha-l1"])
    assert again.read_bytes() == whl.read_bytes()


def test_the_zoo_wheel_refuses_unknown_models(tmp_path):
    with pytest.raises(ValueError, match="not a model folder.*no-such-model"):
        build_zoo_wheel.build(tmp_path, names=["no-such-model"])
    assert build_zoo_wheel.main(["--out", str(tmp_path), "--models", "no-such-model"]) == 2


def test_the_loader_finds_an_installed_zoo(tmp_path, monkeypatch):
    whl = build_zoo_wheel.build(tmp_path / "dist", names=["induction-mha"])
    site = tmp_path / "site"
    with zipfile.ZipFile(whl) as zf:
        zf.extractall(site)
    empty = tmp_path / "checkout-zoo"     # a library install: the loader's folder has no models
    empty.mkdir()
    monkeypatch.delitem(sys.modules, "attnlens_zoo", raising=False)
    monkeypatch.syspath_prepend(str(site))
    found = zoo.find_zoo_dir(checkout=empty, environ={})
    assert found == site / "attnlens_zoo"
    monkeypatch.setattr(zoo, "ZOO_DIR", found)
    assert zoo.available() == ["induction-mha"]
    model = zoo.load("induction-mha")
    assert model.cfg.n_layers == 2


def test_the_checkout_and_the_environment_come_first(tmp_path):
    checkout = Path(zoo.__file__).parent
    assert zoo.find_zoo_dir(checkout=checkout, environ={}) == checkout
    assert zoo.find_zoo_dir(checkout=checkout, environ={"ATTNLENS_ZOO": str(tmp_path)}) \
        == tmp_path


def test_without_models_the_error_says_how_to_install_them(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "attnlens_zoo", None)   # not installed
    assert zoo.find_zoo_dir(checkout=tmp_path, environ={}) == tmp_path
    monkeypatch.setattr(zoo, "ZOO_DIR", tmp_path / "missing")
    assert zoo.available() == []
    with pytest.raises(ValueError, match="no models are installed.*attnlens-zoo.*make setup"):
        zoo.load("text-mha-l2")


def test_import_attnlens_gives_the_everyday_names_lazily():
    code = ("import sys, attnlens\n"
            "assert 'torch' not in sys.modules, 'import attnlens loaded torch'\n"
            "from attnlens import HookedVariantTransformer, VariantConfig, zoo, detect_heads\n"
            "assert HookedVariantTransformer.__module__ == 'attnlens.hooked_models.model'\n"
            "assert zoo.__name__ == 'attnlens.hooked_models.zoo'\n"
            "assert attnlens.interp.tools.heads.detect_heads is detect_heads\n"
            "assert set(attnlens.__all__) <= set(dir(attnlens))\n"
            "try:\n    attnlens.no_such_name\nexcept AttributeError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert "no attribute 'no_such_name'" in out.stdout


def test_every_everyday_name_resolves():
    import attnlens

    for name in attnlens.__all__:
        value = getattr(attnlens, name)
        assert isinstance(value, types.ModuleType) or callable(value), name
