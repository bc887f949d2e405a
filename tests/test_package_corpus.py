"""The package corpus: pinned distributions' sources as extra training text (issue 26 item 2).

Every test builds its own site-packages (dist-info with METADATA and RECORD) and its own
standard library, so nothing depends on what this machine has installed."""

from __future__ import annotations

import json

import numpy as np
import pytest

from attnlens.hooked_models.tokenizers.bpe import cached_stream, encode_documents, train_bpe
from attnlens.training.corpus import Corpus, is_validation
from attnlens.training.package_corpus import PackageCorpus, installed_pins


def make_dist(root, name, version, files: dict[str, bytes | str]) -> None:
    """A distribution installed under `root` as pip leaves it: its files, and a dist-info
    directory whose RECORD lists them."""
    info = root / f"{name}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    for rel, body in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        data = body.encode() if isinstance(body, str) else body
        (root / rel).write_bytes(data)
    record = [f"{rel},," for rel in files] + [f"{info.name}/METADATA,,", f"{info.name}/RECORD,,"]
    (info / "RECORD").write_text("\n".join(record) + "\n")


def heldout_name(val_fraction: float = 0.5) -> str:
    """A stdlib-like relative path that the split holds out."""
    return next(f"distutils/mod{i}.py" for i in range(100)
                if is_validation(f"distutils/mod{i}.py", val_fraction))


@pytest.fixture
def world(tmp_path):
    stdlib_root = tmp_path / "stdlib"
    held = heldout_name()
    for rel, text in {"os2.py": "import sys\n", held: "def held_out():\n    pass\n",
                      "empty.py": ""}.items():
        (stdlib_root / rel).parent.mkdir(parents=True, exist_ok=True)
        (stdlib_root / rel).write_text(text)
    stdlib = Corpus.from_directory(stdlib_root, val_fraction=0.5)
    assert held in stdlib.val_files
    site = tmp_path / "site"
    make_dist(site, "alpha", "1.0", {
        "alpha/__init__.py": "",                               # same bytes as stdlib empty.py
        "alpha/core.py": "def core():\n    return 1\n",
        "alpha/copy_of_core.py": "def core():\n    return 1\n",  # duplicate content
        "alpha/_vendor/" + held: "def held_out():\n    return 2\n",  # held-out path tail
        "alpha/bad.py": b"s = '\xff'\n",                       # not UTF-8
        "alpha/data.txt": "not python\n"})
    make_dist(site, "beta", "2.5", {"beta.py": "class Beta:\n    x = 3\n"})
    return stdlib, site, held


def test_reads_pinned_distributions_and_drops_what_could_leak_or_repeat(world):
    stdlib, site, held = world
    corpus = PackageCorpus.from_installed({"alpha": "1.0", "beta": "2.5"}, stdlib, root=site)
    assert corpus.files == ["alpha/copy_of_core.py", "beta.py"]   # first in sorted order kept
    assert corpus.dropped == {"not_utf8": 1, "duplicate": 1, "same_bytes_as_stdlib": 1,
                              "path_of_heldout_stdlib_file": 1}
    assert corpus.files_per_distribution == {"alpha": 1, "beta": 1}
    assert list(corpus.texts()) == ["def core():\n    return 1\n", "class Beta:\n    x = 3\n"]
    record = corpus.describe()
    assert record["pins"] == {"alpha": "1.0", "beta": "2.5"}
    assert record["n_files"] == 2 and record["sha256"] == corpus.fingerprint
    assert record["bytes"] == sum((site / f).stat().st_size for f in corpus.files)
    with pytest.raises(ValueError, match="training text only"):
        next(corpus.texts("val"))


def test_only_the_named_distributions_are_read(world):
    stdlib, site, _ = world
    corpus = PackageCorpus.from_installed({"beta": "2.5"}, stdlib, root=site)
    assert corpus.files == ["beta.py"]


def test_a_pin_that_is_not_what_is_installed_is_refused_by_name(world):
    stdlib, site, _ = world
    with pytest.raises(ValueError, match=r"alpha: pinned 1\.1, installed 1\.0"):
        PackageCorpus.from_installed({"alpha": "1.1", "beta": "2.5"}, stdlib, root=site)
    with pytest.raises(ValueError, match=r"gamma==3 is not installed"):
        PackageCorpus.from_installed({"gamma": "3"}, stdlib, root=site)
    with pytest.raises(ValueError, match="pins is empty"):
        PackageCorpus.from_installed({}, stdlib, root=site)


def test_names_match_as_pip_normalises_them(world):
    stdlib, site, _ = world
    assert PackageCorpus.from_installed({"BETA": "2.5"}, stdlib, root=site).files == ["beta.py"]


def test_fingerprint_tracks_pins_paths_and_bytes(world):
    stdlib, site, _ = world
    pins = {"alpha": "1.0", "beta": "2.5"}
    before = PackageCorpus.from_installed(pins, stdlib, root=site).fingerprint
    assert PackageCorpus.from_installed(pins, stdlib, root=site).fingerprint == before
    (site / "beta.py").write_text("class Beta:\n    x = 4\n")
    assert PackageCorpus.from_installed(pins, stdlib, root=site).fingerprint != before
    only_beta = PackageCorpus.from_installed({"beta": "2.5"}, stdlib, root=site)
    assert only_beta.fingerprint != before


def test_the_one_pass_fingerprint_and_size_equal_a_fresh_read(world):
    """from_installed hashes and sizes the files in its dedup pass; a corpus built from the same
    file list (which reads them again) gets the same fingerprint and byte count."""
    stdlib, site, _ = world
    pins = {"alpha": "1.0", "beta": "2.5"}
    once = PackageCorpus.from_installed(pins, stdlib, root=site)
    fresh = PackageCorpus(root=once.root, pins=pins, files=list(once.files))
    assert fresh.fingerprint == once.fingerprint
    assert fresh.describe()["bytes"] == once.describe()["bytes"] > 0


def test_stream_is_cached_and_chunking_does_not_change_it(world, tmp_path):
    stdlib, site, _ = world
    corpus = PackageCorpus.from_installed({"alpha": "1.0", "beta": "2.5"}, stdlib, root=site)
    tok = train_bpe(list(stdlib.texts("train")) * 5, vocab_size=300)
    stream = cached_stream(tok, corpus, "train", tmp_path / "cache")
    assert (stream == tok.bos_token_id).sum() == len(corpus.files)
    texts = list(corpus.texts()) * 7
    whole = encode_documents(tok, texts, chunk=len(texts))
    for chunk in (1, 2, 5):
        assert np.array_equal(encode_documents(tok, texts, chunk=chunk), whole)
    with pytest.raises(ValueError, match="chunk"):
        encode_documents(tok, texts, chunk=0)


def test_installed_pins_lists_this_environment_minus_the_excluded():
    pins = installed_pins(exclude=["NumPy"])
    assert "numpy" not in {n.lower() for n in pins}
    assert pins and all(isinstance(v, str) and v for v in pins.values())
    normal = [n.lower().replace("_", "-").replace(".", "-") for n in pins]
    assert normal == sorted(normal)


def test_the_shipped_pin_list_is_well_formed():
    from attnlens.lab.text_recipes import PACKAGE_PINS_FILE, package_pins

    doc = json.loads(PACKAGE_PINS_FILE.read_text())
    pins = package_pins()
    assert pins == doc["pins"] and len(pins) > 100
    assert {"torch", "transformers", "numpy"} <= set(pins)
    assert not {n.lower() for n in doc["excluded"]} & {n.lower() for n in pins}
    assert "attnlens" in doc["excluded"]   # our own code changes with every commit


def test_a_packages_recipe_trains_on_the_stdlib_then_the_packages(world, tmp_path, monkeypatch):
    """text_train.training_stream: the standard library's training stream followed by the
    package sources' (same tokenizer), and the record its card carries; a "stdlib" recipe
    gets the standard library's stream unchanged."""
    from attnlens.lab import text_train
    from attnlens.lab.text_recipes import PACKAGE_RECIPES, RECIPES
    from attnlens.training import package_corpus

    stdlib, site, _ = world
    monkeypatch.setattr(package_corpus, "site_packages", lambda: site)
    monkeypatch.setattr(text_train, "package_pins", lambda: {"alpha": "1.0", "beta": "2.5"})
    tok = train_bpe(list(stdlib.texts("train")) * 5, vocab_size=300)
    train = cached_stream(tok, stdlib, "train", tmp_path / "cache")
    data = text_train.TextData(stdlib, tok, train, cached_stream(tok, stdlib, "val",
                                                                tmp_path / "cache"))
    name = "text-dcmha-l2-pkgs"
    assert PACKAGE_RECIPES[name].corpus == "stdlib+packages"
    stream, record = text_train.training_stream(name, data, tmp_path / "cache")
    extra = encode_documents(tok, ["def core():\n    return 1\n", "class Beta:\n    x = 3\n"])
    assert np.array_equal(stream, np.concatenate([train, extra]))
    assert record["pins"] == {"alpha": "1.0", "beta": "2.5"} and record["n_files"] == 2
    assert record["tokens"] == len(extra) and record["stdlib_train_tokens"] == len(train)
    plain, none = text_train.training_stream(next(iter(RECIPES)), data, tmp_path / "cache")
    assert plain is train and none is None


def test_a_recipe_names_a_known_corpus():
    from attnlens.lab.text_recipes import Recipe

    with pytest.raises(ValueError, match="corpus 'pypi'"):
        Recipe("t", "mha", "l2", corpus="pypi")
