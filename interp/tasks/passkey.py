"""Passkey retrieval (Infini-attention paper, arXiv 2404.07143, section 4.2 and appendix B).

A numeric key is hidden at a chosen depth inside repeated filler text; at the end the model is
asked for it. The prompt has the paper's shape (appendix B):

    There is an important info hidden inside a lot of irrelevant text. Find it and memorize
    them. I will quiz you about the important information there. The grass is green. The sky is
    blue. The sun is yellow. Here we go. There and back again. (repeat x times) The pass key is
    9054. Remember it. 9054 is the pass key. (filler, repeat y times) What is the pass key?
    The pass key is

followed, for teacher forcing, by the answer " 9054". `passkey_task` builds a batch whose every
row is exactly `length` tokens (BOS, prompt, answer): the filler is the paper's sentence group
repeated and cut to fit, and `depth` in [0, 1] is the fraction of the filler placed before the
key, rounded to a whole sentence group (0: right after the introduction, 1: right before the
question). Only the key's tokens are
scored: `passkey_accuracy` is token-level accuracy (the paper's metric), `exact=True` counts a
row only if every key token is right. `evaluate_passkey` sweeps lengths and depths, streaming
inputs longer than n_ctx through an Infini-attention model in constant memory.

Example:
    >>> from attnlens.hooked_models import CharTokenizer
    >>> batch = passkey_task(2, length=400, depth=0.5, tokenizer=CharTokenizer(), seed=0)
    >>> batch.tokens.shape, batch.keys
    (torch.Size([2, 400]), ['60494', '65125'])
    >>> logits = torch.zeros(2, 400, 101)
    >>> passkey_accuracy(logits, batch)
    0.0
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pandas as pd
import torch
from torch import Tensor

INTRO = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize "
         "them. I will quiz you about the important information there.")
FILLER = (" The grass is green. The sky is blue. The sun is yellow. Here we go."
          " There and back again.")
KEY_LINE = " The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = " What is the pass key? The pass key is"


@dataclass
class PasskeyBatch:
    """A batch of passkey prompts with their answers appended (teacher forcing).

    Attributes:
        tokens: `[batch length]` ids: [BOS] intro, filler, key line, filler, question, " ", key.
        answer_mask: `[batch length]` True at the key's tokens at the end (the scored targets).
        key_pos: `[batch]` index of the first token of the key line (" The pass key is ...").
        keys: the keys as digit strings.
        length, depth: as requested.
    """

    tokens: Tensor
    answer_mask: Tensor
    key_pos: Tensor
    keys: list[str]
    length: int
    depth: float


class PasskeyTokenizer:
    """Word-level tokenizer of the passkey prompt: one id per word, punctuation mark and digit.

    Small models trained from scratch on passkey retrieval need short sequences; the paper's
    subword tokenizers also split numbers into digits, as this one does. Words are the prompt's
    own (`INTRO`, `FILLER`, `KEY_LINE`, `QUESTION`); id 0 is BOS. Whitespace separates words
    and is not a token, so `encode(" ")` is empty.

    Example:
        >>> tok = PasskeyTokenizer()
        >>> tok.decode(tok.encode(" The pass key is 905."))
        'The pass key is 9 0 5 .'
    """

    bos_token = "<bos>"
    bos_token_id = 0

    def __init__(self):
        texts = (INTRO, FILLER, KEY_LINE.format(key=""), QUESTION)
        words = dict.fromkeys(w for text in texts for w in self._split(text))
        self.words: tuple[str, ...] = (self.bos_token, *"0123456789", *words)
        self._ids = {w: i for i, w in enumerate(self.words)}

    @staticmethod
    def _split(text: str) -> list[str]:
        out = []
        for word in text.split():
            core = word.rstrip(".?")
            out += list(core) if core.isdigit() else ([core] if core else [])
            out += list(word[len(core):])
        return out

    @property
    def vocab_size(self) -> int:
        return len(self.words)

    def encode(self, text: str) -> list[int]:
        try:
            return [self._ids[w] for w in self._split(text)]
        except KeyError as err:
            raise ValueError(f"word {err.args[0]!r} is not in the passkey vocabulary") from None

    def decode(self, ids) -> str:
        if isinstance(ids, int) or getattr(ids, "ndim", None) == 0:
            ids = [ids]
        return " ".join(self.words[int(i)] for i in ids)


def _encode(tokenizer, text: str) -> list[int]:
    try:   # HuggingFace tokenizers: no special tokens inside the prompt
        return list(tokenizer.encode(text, add_special_tokens=False))
    except TypeError:
        return list(tokenizer.encode(text))


def passkey_task(batch: int, length: int, depth: float, tokenizer, n_digits: int = 5,
                 seed: int | None = None, bos: bool = True) -> PasskeyBatch:
    """`batch` passkey prompts of exactly `length` tokens with the key at `depth`.

    Args:
        tokenizer: anything with `encode(text) -> ids` (the built-in `CharTokenizer`, a
            HuggingFace tokenizer, or `model.tokenizer`).
        n_digits: digits of the random key (the paper's example, 9054, has 4).
        bos: prepend `tokenizer.bos_token_id`.

    Returns:
        A `PasskeyBatch`; ValueError if `length` cannot hold the prompt without filler.
    """
    if batch < 1 or n_digits < 1:
        raise ValueError(f"batch and n_digits must be >= 1, got {batch}, {n_digits}")
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must lie in [0, 1], got {depth}")
    rng = random.Random(seed)
    head = ([tokenizer.bos_token_id] if bos else []) + _encode(tokenizer, INTRO)
    unit, question, space = (_encode(tokenizer, t) for t in (FILLER, QUESTION, " "))
    rows, masks, key_pos, keys = [], [], [], []
    for _ in range(batch):
        key = str(rng.randrange(10 ** (n_digits - 1), 10 ** n_digits))
        key_line, answer = _encode(tokenizer, KEY_LINE.format(key=key)), _encode(tokenizer, key)
        fixed = len(head) + len(key_line) + len(question) + len(space) + len(answer)
        budget = length - fixed
        if budget < 0:
            raise ValueError(f"length={length} is too short for the passkey prompt: it needs at "
                             f"least {fixed} tokens")
        filler = (unit * (budget // len(unit) + 1))[:budget]
        # Split at the filler-group boundary nearest depth * budget (either end is exact).
        cuts = [*range(0, budget, len(unit)), budget]
        cut = min(cuts, key=lambda c: abs(c - depth * budget))
        before = filler[:cut]
        row = head + before + key_line + filler[cut:] + question + space + answer
        rows.append(row)
        masks.append([False] * (len(row) - len(answer)) + [True] * len(answer))
        key_pos.append(len(head) + len(before))
        keys.append(key)
    return PasskeyBatch(torch.tensor(rows), torch.tensor(masks), torch.tensor(key_pos), keys,
                        length, depth)


def _check_predictions(pred: Tensor, batch: PasskeyBatch) -> Tensor:
    if pred.shape != (batch.tokens.shape[0], batch.length - 1):
        raise ValueError(f"expected predictions for {tuple(batch.tokens.shape)} tokens, got "
                         f"shape {tuple(pred.shape)}")
    return pred.to(batch.tokens.device) == batch.tokens[:, 1:]


def passkey_accuracy(logits: Tensor, batch: PasskeyBatch, exact: bool = False) -> float:
    """Token-level accuracy of the greedy predictions of the key (teacher-forced).

    `logits` are `[batch length d_vocab]` for `batch.tokens`, or already-argmaxed predictions
    `[batch length-1]` (position t predicts token t+1). With `exact=True`, the fraction of rows
    whose every key token is right.
    """
    pred = logits[:, :-1].argmax(-1) if logits.is_floating_point() else logits
    correct = _check_predictions(pred, batch)
    mask = batch.answer_mask[:, 1:]
    if exact:
        return float((correct | ~mask).all(-1).float().mean())
    return float(correct[mask].float().mean())


@torch.no_grad()
def predict(model, batch: PasskeyBatch, chunk: int = 4096) -> Tensor:
    """Greedy next-token predictions `[batch length-1]` of `model` on `batch.tokens`.

    Inputs longer than n_ctx are streamed through `attnlens.hooked_models.streaming.InfiniStream` in
    chunks (Infini-attention models only); only the argmax ids are kept.
    """
    tokens = batch.tokens.to(model.cfg.device)
    if tokens.shape[1] <= model.cfg.n_ctx:
        return model(tokens)[:, :-1].argmax(-1)
    from attnlens.hooked_models.streaming import InfiniStream

    stream = InfiniStream(model)
    pred = [stream.feed(tokens[:, i:i + chunk]).argmax(-1) for i in range(0, tokens.shape[1],
                                                                         chunk)]
    return torch.cat(pred, 1)[:, :-1]


def cell_seed(seed: int, i: int, j: int) -> int:
    """The prompt seed of `evaluate_passkey`'s cell (length index i, depth index j): one
    formula, so that code listing the evaluation's seeds (held-out checks) cannot drift."""
    return seed + 1000 * i + j


def evaluate_passkey(model, lengths, depths=(0.0, 0.5, 1.0), n: int = 8, n_digits: int = 5,
                     seed: int = 0, tokenizer=None, chunk: int = 4096) -> pd.DataFrame:
    """Accuracy over a grid of lengths x depths; one row per cell.

    Returns a DataFrame with columns length, depth, n, token_accuracy, exact_accuracy.
    """
    tokenizer = tokenizer if tokenizer is not None else model.tokenizer
    if tokenizer is None:
        raise ValueError("evaluate_passkey needs a tokenizer (the model has none)")
    rows = []
    for i, length in enumerate(lengths):
        for j, depth in enumerate(depths):
            batch = passkey_task(n, length, depth, tokenizer, n_digits,
                                 seed=cell_seed(seed, i, j))
            pred = predict(model, batch, chunk)
            rows.append(dict(length=length, depth=depth, n=n,
                             token_accuracy=passkey_accuracy(pred, batch),
                             exact_accuracy=passkey_accuracy(pred, batch, exact=True)))
    return pd.DataFrame(rows)


__all__ = ["PasskeyBatch", "PasskeyTokenizer", "cell_seed", "evaluate_passkey",
           "passkey_accuracy", "passkey_task", "predict"]
