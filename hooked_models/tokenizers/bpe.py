"""Byte-level BPE tokenizer (HF `tokenizers`) for models trained on text, and token-stream caches.

`BPETokenizer` speaks the small interface `TokenizationMixin` uses (`__call__` returning
`input_ids`, `decode`, `bos_token_id`, `pad_token_id`), so `to_tokens` / `to_str_tokens` work on
it; it is saved beside a checkpoint as `tokenizer.json` and loaded back by `from_pretrained`.

Example:
    >>> tok = train_bpe(["def f(x):\\n    return x\\n"] * 20, vocab_size=300)
    >>> tok.decode(tok("return x")["input_ids"])
    'return x'
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

BOS_TOKEN = "<|bos|>"
TOKENIZER_FILE = "tokenizer.json"


class BPETokenizer:
    """A thin wrapper over a `tokenizers.Tokenizer` whose id 0 is the BOS token."""

    bos_token = BOS_TOKEN
    pad_token_id = None  # padding reuses BOS (TokenizationMixin's rule)

    def __init__(self, tokenizer: Tokenizer):
        bos = tokenizer.token_to_id(BOS_TOKEN)
        if bos is None:
            raise ValueError(f"tokenizer has no {BOS_TOKEN!r} token")
        self.inner = tokenizer
        self.bos_token_id = bos

    @property
    def vocab_size(self) -> int:
        return self.inner.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self.inner.encode(text, add_special_tokens=False).ids

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        return {"input_ids": self.encode(text)}

    def decode(self, ids) -> str:
        return self.inner.decode([int(i) for i in ids], skip_special_tokens=False)

    def to_json(self) -> str:
        return self.inner.to_str()

    def save(self, path) -> None:
        Path(path).write_text(self.to_json(), encoding="utf-8")

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.to_json().encode("utf-8")).hexdigest()

    @classmethod
    def from_file(cls, path) -> BPETokenizer:
        path = Path(path)
        try:
            return cls(Tokenizer.from_file(str(path)))
        except Exception as err:  # tokenizers raises its own exception type
            raise ValueError(f"{path} is not a valid tokenizer.json: {err}") from None


def train_bpe(texts: Iterable[str], vocab_size: int = 4096) -> BPETokenizer:
    """A byte-level BPE with `vocab_size` ids (id 0 = BOS) trained on `texts`.

    Byte-level: every string is encodable (256 byte symbols are always in the vocabulary), so
    decode(encode(s)) == s for any text.
    """
    if vocab_size < 257 + 1:
        raise ValueError(f"vocab_size must be >= 258 (256 bytes + BOS + one merge), "
                         f"got {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[BOS_TOKEN],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return BPETokenizer(tok)


def encode_documents(tokenizer: BPETokenizer, texts: Iterable[str],
                     chunk: int = 256) -> np.ndarray:
    """One uint16 stream: each document as [BOS] + its tokens, documents concatenated in order.

    Documents are encoded `chunk` at a time, so a corpus of hundreds of MB never holds more
    than one chunk's encodings (the stream does not depend on `chunk`)."""
    if tokenizer.vocab_size > np.iinfo(np.uint16).max + 1:
        raise ValueError(f"vocab_size {tokenizer.vocab_size} does not fit uint16 streams")
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    parts, batch = [], []

    def flush():
        for e in tokenizer.inner.encode_batch(batch, add_special_tokens=False):
            parts.append(np.asarray([tokenizer.bos_token_id] + e.ids, dtype=np.uint16))
        batch.clear()

    for text in texts:
        batch.append(text)
        if len(batch) == chunk:
            flush()
    flush()
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint16)


def cached_stream(tokenizer: BPETokenizer, corpus, split: str, cache_dir) -> np.ndarray:
    """The token stream of `corpus`'s `split`, cached as .npy keyed by corpus and tokenizer hash.

    The cache key covers everything the stream depends on, so a stale file is never reused.
    """
    key = hashlib.sha256(f"{corpus.fingerprint}:{tokenizer.sha256}".encode()).hexdigest()[:20]
    path = Path(cache_dir) / f"{split}-{key}.npy"
    if path.is_file():
        return np.load(path, allow_pickle=False)
    stream = encode_documents(tokenizer, corpus.texts(split))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp.npy")
    np.save(tmp, stream, allow_pickle=False)
    os.replace(tmp, path)  # atomic: readers never see half a file
    return stream
