"""The stdlib corpus (deterministic list, hash, held-out files) and the BPE tokenizer."""

from __future__ import annotations

import json
import sysconfig
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open

from attnlens.hooked_models import HookedVariantTransformer, VariantConfig
from attnlens.hooked_models.tokenizers import bpe as bpe_module
from attnlens.hooked_models.tokenizers.bpe import (
    BPETokenizer,
    cached_stream,
    encode_documents,
    train_bpe,
)
from attnlens.training.corpus import Corpus, is_validation

TEXTS = ["def add(a, b):\n    return a + b\n", "class Point:\n    x: int = 0\n",
         "import os\nprint(os.getcwd())\n"] * 10


def make_tree(root: Path) -> None:
    for rel, text in {"b.py": "x = 1\n", "a/c.py": "def f():\n    pass\n",
                      "a/d.py": "y = 2\n", "site-packages/e.py": "third_party = 1\n",
                      "__pycache__/f.py": "z = 3\n", "notes.txt": "not python\n"}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "bad.py").write_bytes(b"s = '\xff\xfe'\n")  # not UTF-8


def test_corpus_lists_sorted_utf8_py_files_outside_site_packages(tmp_path):
    make_tree(tmp_path)
    corpus = Corpus.from_directory(tmp_path, val_fraction=0.5)
    assert corpus.files == ["a/c.py", "a/d.py", "b.py"]
    assert corpus.skipped == ["bad.py"]
    assert sorted(corpus.train_files + corpus.val_files) == corpus.files
    assert not set(corpus.train_files) & set(corpus.val_files)
    assert corpus.val_files == [f for f in corpus.files if is_validation(f, 0.5)]


def test_fingerprint_tracks_every_byte_and_path(tmp_path):
    make_tree(tmp_path)
    before = Corpus.from_directory(tmp_path).fingerprint
    assert Corpus.from_directory(tmp_path).fingerprint == before
    (tmp_path / "b.py").write_text("x = 2\n")
    changed = Corpus.from_directory(tmp_path).fingerprint
    assert changed != before
    (tmp_path / "b.py").rename(tmp_path / "b2.py")
    assert Corpus.from_directory(tmp_path).fingerprint != changed


def test_validation_split_depends_on_the_path_only():
    paths = [f"pkg/mod{i}.py" for i in range(2000)]
    held = [p for p in paths if is_validation(p, 0.05)]
    assert 50 < len(held) < 150  # 5% of 2000 = 100, binomial sd ~ 10
    assert held == [p for p in paths if is_validation(p, 0.05)]


def test_stdlib_corpus_reads_the_running_interpreter():
    corpus = Corpus.from_stdlib(max_files=30)
    assert corpus.root == Path(sysconfig.get_paths()["stdlib"])
    assert corpus.files == sorted(corpus.files) and len(corpus.files) >= 28
    assert all(f.endswith(".py") and "site-packages" not in f for f in corpus.files)
    record = corpus.describe()
    assert record["sha256"] == corpus.fingerprint and record["n_files"] == len(corpus.files)


@pytest.mark.parametrize("kw, match", [(dict(val_fraction=0.0), "val_fraction"),
                                       (dict(max_files=1), "max_files")])
def test_bad_corpus_arguments(tmp_path, kw, match):
    make_tree(tmp_path)
    with pytest.raises(ValueError, match=match):
        Corpus.from_directory(tmp_path, **kw)


def test_empty_or_missing_root_raises(tmp_path):
    with pytest.raises(ValueError, match="no .py files"):
        Corpus.from_directory(tmp_path)
    with pytest.raises(ValueError, match="not a directory"):
        Corpus.from_directory(tmp_path / "nope")


def test_bpe_round_trips_any_text_and_is_deterministic():
    tok = train_bpe(TEXTS, vocab_size=300)
    assert tok.bos_token_id == 0 and 257 <= tok.vocab_size <= 300
    for text in ["def add(a, b):", "héllo ✓ wörld\n\t", "\x00 bytes"]:
        assert tok.decode(tok.encode(text)) == text
    assert len(tok.encode("return a + b")) < len("return a + b")  # merges were learned
    assert train_bpe(TEXTS, vocab_size=300).to_json() == tok.to_json()
    with pytest.raises(ValueError, match="vocab_size"):
        train_bpe(TEXTS, vocab_size=100)


def test_streams_lead_each_document_with_bos_and_are_cached(tmp_path, monkeypatch):
    (tmp_path / "src").mkdir()
    for i, text in enumerate(TEXTS[:6]):
        (tmp_path / "src" / f"m{i}.py").write_text(text)
    corpus = Corpus.from_directory(tmp_path / "src", val_fraction=0.3)
    tok = train_bpe(corpus.texts("train"), vocab_size=300)
    stream = cached_stream(tok, corpus, "train", tmp_path / "cache")
    assert stream.dtype == np.uint16 and (stream == 0).sum() == len(corpus.train_files)
    expected = encode_documents(tok, corpus.texts("train"))
    assert np.array_equal(stream, expected)
    monkeypatch.setattr(bpe_module, "encode_documents", lambda *a: 1 / 0)
    assert np.array_equal(cached_stream(tok, corpus, "train", tmp_path / "cache"), stream)
    assert len(list((tmp_path / "cache").glob("*.npy"))) == 1


def test_checkpoint_carries_the_tokenizer_and_fp16_weights(tmp_path):
    tok = train_bpe(TEXTS, vocab_size=300)
    cfg = VariantConfig(d_model=16, d_head=8, n_layers=1, n_ctx=32, d_vocab=tok.vocab_size,
                        seed=0)
    model = HookedVariantTransformer(cfg, tokenizer=tok)
    model.save_pretrained(tmp_path / "m", weights_dtype=torch.float16)
    assert json.loads((tmp_path / "m" / "tokenizer.json").read_text())["model"]["type"] == "BPE"
    with safe_open(str(tmp_path / "m" / "model.safetensors"), "pt") as f:
        assert f.get_tensor("embed.W_E").dtype == torch.float16
    loaded = HookedVariantTransformer.from_pretrained(tmp_path / "m")
    assert isinstance(loaded.tokenizer, BPETokenizer)
    text = "def add(a, b):"
    assert torch.equal(loaded.to_tokens(text), model.to_tokens(text))
    assert loaded.to_tokens(text)[0, 0].item() == 0
    assert "".join(loaded.to_str_tokens(text)[1:]) == text
    assert torch.equal(loaded.W_E, model.W_E.half().float())


def test_corrupt_tokenizer_file_is_named(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError, match="tokenizer.json"):
        BPETokenizer.from_file(tmp_path / "tokenizer.json")
