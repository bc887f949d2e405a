"""TransformerLens-style text <-> token helpers, mixed into `HookedVariantTransformer`.

Works with the built-in `CharTokenizer` (offline) or any HuggingFace tokenizer the user passes
(loaded from a local path; nothing is downloaded here).
"""

from __future__ import annotations

import re

import torch
from torch import Tensor

from attnlens.hooked_models.tokenizers.vocab import CharTokenizer

# How `to_string` labels a model id beyond its character tokenizer (d_vocab > alphabet + 1).
_UNUSED_LABEL = re.compile(r"<unused:(\d+)>")


class TokenizationMixin:
    tokenizer: object | None

    def _require_tokenizer(self):
        if self.tokenizer is None:
            raise ValueError("this model has no tokenizer: pass token ids, or build the model with "
                             "cfg.tokenizer_alphabet or tokenizer=<a local HF tokenizer>")
        return self.tokenizer

    def _encode(self, text: str) -> list[int]:
        tok = self._require_tokenizer()
        if isinstance(tok, CharTokenizer):
            # A leading space is a word-boundary mark to BPE tokenizers (TransformerLens's
            # test_prompt adds one to the answer); an alphabet without a space drops it.
            if text.startswith(" ") and " " not in tok.alphabet:
                text = text[1:]
            # "<bos>" is read by the tokenizer; "<unused:N>" labels (see `_char_text`) of ids
            # this model has beyond its alphabet are read here, so decoded text reads back.
            ids, start = [], 0
            for match in _UNUSED_LABEL.finditer(text):
                i = int(match.group(1))
                if tok.vocab_size <= i < self.cfg.d_vocab:
                    ids += tok.encode(text[start:match.start()]) + [i]
                    start = match.end()
            return ids + tok.encode(text[start:])
        return list(tok(text, add_special_tokens=False)["input_ids"])

    def _bos_id(self) -> int:
        tok = self._require_tokenizer()
        bos = getattr(tok, "bos_token_id", None)
        if bos is None:
            raise ValueError("the tokenizer has no BOS token; call with prepend_bos=False")
        return bos

    def _pad_id(self) -> int:
        tok = self._require_tokenizer()
        pad = getattr(tok, "pad_token_id", None)
        return self._bos_id() if pad is None else pad

    def to_tokens(self, text: str | list[str], prepend_bos: bool | None = None) -> Tensor:
        """`[batch pos]` token ids; a list of texts is right-padded (see `padding_mask`).

        Example:
            >>> model.to_tokens("ab")          # doctest: +SKIP
            tensor([[ 0, 11, 12]])
        """
        if prepend_bos is None:
            prepend_bos = self.cfg.default_prepend_bos
        texts = [text] if isinstance(text, str) else list(text)
        if not texts or not all(isinstance(t, str) for t in texts):
            raise ValueError("to_tokens expects a string or a non-empty list of strings")
        rows = [([self._bos_id()] if prepend_bos else []) + self._encode(t) for t in texts]
        if any(len(r) == 0 for r in rows):
            raise ValueError("cannot tokenize an empty string without a BOS token")
        width = max(len(r) for r in rows)
        pad = self._pad_id()
        out = torch.tensor([r + [pad] * (width - len(r)) for r in rows], dtype=torch.long)
        return out.to(self.cfg.device)

    def padding_mask(self, text: str | list[str], prepend_bos: bool | None = None) -> Tensor:
        """`[batch pos]` 1 for real tokens, 0 for the right padding that `to_tokens` adds."""
        if prepend_bos is None:
            prepend_bos = self.cfg.default_prepend_bos
        texts = [text] if isinstance(text, str) else list(text)
        if not texts:
            raise ValueError("padding_mask expects a string or a non-empty list of strings, "
                             "got an empty list")
        lengths = [len(self._encode(t)) + int(prepend_bos) for t in texts]
        width = max(lengths)
        return torch.tensor([[1] * n + [0] * (width - n) for n in lengths],
                            device=self.cfg.device)

    def to_string(self, tokens) -> str | list[str]:
        """Decode one id or `[pos]` ids to a string, or `[batch pos]` ids to a list of strings.

        As TransformerLens's `to_string` (the tokenizer's decode, special tokens kept), BOS is
        written out ("<bos>" for the character tokenizer), and `to_tokens` reads it back:
        `to_tokens(to_string(ids), prepend_bos=False)` gives `ids` again (with the default
        prepend_bos=True a second BOS is prepended, as in TransformerLens).

        Example:
            >>> model.to_string(model.to_tokens("abc")[0])          # doctest: +SKIP
            '<bos>abc'
        """
        tok = self._require_tokenizer()
        tokens = torch.as_tensor(tokens)
        if tokens.ndim == 2:
            return [self.to_string(row) for row in tokens]
        if tokens.ndim > 2:
            raise ValueError(f"to_string takes one id, [pos] or [batch pos] ids, got shape "
                             f"{tuple(tokens.shape)}")
        ids = tokens.reshape(-1).tolist()
        if isinstance(tok, CharTokenizer):
            return "".join(self._char_text(tok, i) for i in ids)
        return tok.decode(ids)

    def _char_text(self, tok: CharTokenizer, i: int) -> str:
        # A model may have more ids (d_vocab) than its character tokenizer: those ids are valid
        # model outputs with no text, so label them instead of failing (e.g. in test_prompt's
        # top-k list).
        if tok.vocab_size <= i < self.cfg.d_vocab:
            return f"<unused:{i}>"
        return tok.id_to_str(int(i))

    def to_str_tokens(self, text, prepend_bos: bool | None = None) -> list[str]:
        """One string per token, for axis labels (`text` may be a string or `[pos]` ids)."""
        if isinstance(text, str):
            text = self.to_tokens(text, prepend_bos=prepend_bos)[0]
        ids = torch.as_tensor(text)
        if ids.ndim == 0:  # one id, as HF's to_str_tokens accepts
            ids = ids[None]
        if ids.ndim == 2:
            if ids.shape[0] != 1:
                raise ValueError("to_str_tokens takes one sequence, got a batch of "
                                 f"{ids.shape[0]}")
            ids = ids[0]
        tok = self._require_tokenizer()
        if isinstance(tok, CharTokenizer):
            return [self._char_text(tok, int(i)) for i in ids]
        return [tok.decode([int(i)]) for i in ids]

    def to_single_token(self, string: str) -> int:
        """The id of `string`, which must be exactly one token."""
        ids = self._encode(string)
        if len(ids) != 1:
            raise ValueError(f"{string!r} is {len(ids)} tokens, not one")
        return ids[0]
