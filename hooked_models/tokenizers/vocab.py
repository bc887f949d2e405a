"""A character-level tokenizer that needs no download: id 0 is BOS, then one id per character.

BOS decodes as the text "<bos>" and that text encodes back to BOS, as a Hugging Face tokenizer
reads its own special tokens ("<|endoftext|>" in GPT-2's) back: `encode(decode(ids)) == ids` for
every sequence of ids, so `model.to_tokens(model.to_string(ids), prepend_bos=False)` gives the
ids again, as it does for a TransformerLens model. The five characters "<bos>" in a row are
therefore read as BOS even when the alphabet holds them.

Example:
    >>> tok = CharTokenizer("abc")
    >>> tok.encode("cab")
    [3, 1, 2]
    >>> tok.decode([0, 3, 1])
    '<bos>ca'
    >>> tok.encode("<bos>ca")
    [0, 3, 1]
    >>> tok.decode(2)
    'b'
"""

from __future__ import annotations

import string

DEFAULT_ALPHABET = string.printable[:-5] + "\n"  # printable ASCII without \t\r\x0b\x0c


class CharTokenizer:
    bos_token = "<bos>"
    bos_token_id = 0

    def __init__(self, alphabet: str = DEFAULT_ALPHABET):
        if len(set(alphabet)) != len(alphabet):
            raise ValueError("tokenizer alphabet has repeated characters")
        if not alphabet:
            raise ValueError("tokenizer alphabet is empty")
        self.alphabet = alphabet
        self._ids = {c: i + 1 for i, c in enumerate(alphabet)}

    @property
    def vocab_size(self) -> int:
        return len(self.alphabet) + 1

    def encode(self, text: str) -> list[int]:
        """One id per character; each "<bos>" in `text` is the BOS id (see the module doc)."""
        ids: list[int] = []
        for i, piece in enumerate(text.split(self.bos_token)):
            if i:
                ids.append(self.bos_token_id)
            try:
                ids.extend(self._ids[c] for c in piece)
            except KeyError as err:
                raise ValueError(f"character {err.args[0]!r} is not in the tokenizer alphabet "
                                 f"{self.alphabet!r}") from None
        return ids

    def decode(self, ids) -> str:
        """Text of a sequence of ids; a single id (int or 0-d tensor) decodes as HF's do."""
        if isinstance(ids, int) or getattr(ids, "ndim", None) == 0:
            ids = [ids]
        return "".join(self.id_to_str(int(i)) for i in ids)

    def id_to_str(self, i: int) -> str:
        if i == self.bos_token_id:
            return self.bos_token
        if not 0 < i <= len(self.alphabet):
            raise ValueError(f"token id {i} is outside the tokenizer vocabulary "
                             f"[0, {self.vocab_size})")
        return self.alphabet[i - 1]


WORD_TOKENIZER_KIND = "attnlens-word-tokenizer"   # the "type" of its tokenizer.json


class WordTokenizer:
    """A word-level tokenizer over a fixed vocabulary: one id per word, `words[i]` is id i.

    The toy tasks' models (counting, Flip-Flop, selective copy, conjunction, composition,
    passkey) read whole words. `pattern` (a regular expression) cuts text into words: by
    default the whitespace-separated pieces; the passkey tokenizer also cuts digits and the
    marks "." and "?" apart. `decode` joins words with spaces, and `encode(decode(ids)) == ids`.
    Saved beside a checkpoint as `tokenizer.json` (`to_json`), loaded back by `from_pretrained`.

    Example:
        >>> tok = WordTokenizer(("<bos>", "<pad>", "a", "=", "0", ";"), pad_token="<pad>")
        >>> tok.encode("a = 0 ;")
        [2, 3, 4, 5]
        >>> tok.decode([0, 2, 3])
        '<bos> a ='
        >>> WordTokenizer.from_json(tok.to_json()).encode("<bos> a") == [0, 2]
        True
    """

    def __init__(self, words, bos_token: str = "<bos>", pad_token: str | None = None,
                 pattern: str = r"\S+"):
        import re

        self.words: tuple[str, ...] = tuple(words)
        if not self.words or len(set(self.words)) != len(self.words):
            raise ValueError("a word vocabulary must be non-empty, with distinct words")
        if bos_token not in self.words:
            raise ValueError(f"the BOS token {bos_token!r} is not in the vocabulary")
        if pad_token is not None and pad_token not in self.words:
            raise ValueError(f"the pad token {pad_token!r} is not in the vocabulary")
        self.bos_token, self.pad_token, self.pattern = bos_token, pad_token, pattern
        self._ids = {w: i for i, w in enumerate(self.words)}
        self._split = re.compile(pattern)
        self.bos_token_id = self._ids[bos_token]
        self.pad_token_id = None if pad_token is None else self._ids[pad_token]

    @property
    def vocab_size(self) -> int:
        return len(self.words)

    def encode(self, text: str) -> list[int]:
        try:
            return [self._ids[w] for w in self._split.findall(text)]
        except KeyError as err:
            shown = " ".join(self.words[:40]) + (" ..." if len(self.words) > 40 else "")
            raise ValueError(f"word {err.args[0]!r} is not in the tokenizer's vocabulary of "
                             f"{len(self.words)} words: {shown}") from None

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        return {"input_ids": self.encode(text)}

    def decode(self, ids) -> str:
        if isinstance(ids, int) or getattr(ids, "ndim", None) == 0:
            ids = [ids]
        out = []
        for i in ids:
            i = int(i)
            if not 0 <= i < len(self.words):
                raise ValueError(f"token id {i} is outside the tokenizer vocabulary "
                                 f"[0, {len(self.words)})")
            out.append(self.words[i])
        return " ".join(out)

    def to_json(self) -> str:
        import json

        return json.dumps({"type": WORD_TOKENIZER_KIND, "version": 1, "words": list(self.words),
                           "bos_token": self.bos_token, "pad_token": self.pad_token,
                           "pattern": self.pattern}, indent=1)

    @classmethod
    def from_json(cls, text: str, source: str = "tokenizer.json") -> WordTokenizer:
        import json

        try:
            data = json.loads(text)
            if data.get("type") != WORD_TOKENIZER_KIND:
                raise ValueError(f"type is {data.get('type')!r}, not {WORD_TOKENIZER_KIND!r}")
            return cls(data["words"], data["bos_token"], data.get("pad_token"),
                       data.get("pattern", r"\S+"))
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"{source} is not a valid word tokenizer: {err}") from None

    @staticmethod
    def is_word_tokenizer_json(text: str) -> bool:
        """Whether `text` (a tokenizer.json) holds a `WordTokenizer` (else a HF tokenizer)."""
        import json

        try:
            data = json.loads(text)
        except ValueError:
            return False
        return isinstance(data, dict) and data.get("type") == WORD_TOKENIZER_KIND
