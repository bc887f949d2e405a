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
