"""Two-hop composition questions over a toy word vocabulary, after DCFormer's synthetic set.

DCFormer's `data/synthetic_dataset.jsonl` (variants.md section 3.7) asks in-context questions such
as "Ruth has a sweater. Steven has a taxi. Ruth has a handgun. Ruth does not have a kind of
[vehicle]": the model must bind people to items in the context *and* map items to categories,
two hops that one attention head alone composes poorly. This module generates such questions
over a small word-level vocabulary (one token per word), with three kinds:

    "kind"      X has a plum . Y has a dog . So X has a kind of           -> fruit
    "not_kind"  X has a coat . Y has a taxi . X has a bow . So X does not have a kind of -> vehicle
    "who"       X has a plum . Y has a dog . So who has a kind of animal ?  -> Y

Every category in one question is distinct, so the answer is unique. `composition_accuracy`
scores the prediction at the last real position, by default restricted to the answer's type
(categories for "kind"/"not_kind", names for "who").

Example:
    >>> batch = composition_task(4, kind="kind", seed=0)
    >>> batch.tokens.shape[0], batch.vocab.decode(batch.tokens[0, :6])
    (4, '<bos> Heidi has a sword .')
    >>> logits = torch.zeros(4, batch.tokens.shape[1], len(batch.vocab))
    >>> 0.0 <= composition_accuracy(logits, batch) <= 1.0
    True
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pandas as pd
import torch
import torch.nn.functional as F
from torch import Tensor

# Toy world: people and items grouped by category (one token each).
NAMES = ("Alice", "Bob", "Carol", "Dave", "Erin", "Frank", "Grace", "Heidi")
CATEGORIES: dict[str, tuple[str, ...]] = {
    "fruit": ("apple", "pear", "plum", "mango", "lemon", "cherry"),
    "animal": ("dog", "cat", "horse", "goat", "duck", "fox"),
    "vehicle": ("car", "taxi", "bus", "truck", "bike", "boat"),
    "clothing": ("coat", "shirt", "sock", "scarf", "hat", "dress"),
    "tool": ("hammer", "saw", "drill", "wrench", "chisel", "rake"),
    "instrument": ("piano", "drum", "flute", "violin", "harp", "bugle"),
    "weapon": ("sword", "bow", "spear", "axe", "rifle", "club"),
}
FUNCTION_WORDS = ("has", "a", "an", ".", "So", "does", "not", "have", "kind", "of", "who", "?")
SPECIAL = ("<bos>", "<pad>")
KINDS = ("kind", "not_kind", "who")


class CompositionVocab:
    """Word <-> id map: specials, function words, names, categories, items (in that order)."""

    def __init__(self, names=NAMES, categories=CATEGORIES):
        items = [item for group in categories.values() for item in group]
        self.words: tuple[str, ...] = (*SPECIAL, *FUNCTION_WORDS, *names, *categories, *items)
        if len(set(self.words)) != len(self.words):
            raise ValueError("composition vocabulary words must be distinct")
        self.names, self.categories = tuple(names), dict(categories)
        self.category_of = {item: cat for cat, group in categories.items() for item in group}
        self._ids = {w: i for i, w in enumerate(self.words)}

    def __len__(self) -> int:
        return len(self.words)

    @property
    def bos(self) -> int:
        return self._ids["<bos>"]

    @property
    def pad(self) -> int:
        return self._ids["<pad>"]

    def ids(self, words) -> list[int]:
        """Token ids of `words`; ValueError naming an unknown word."""
        try:
            return [self._ids[w] for w in words]
        except KeyError as err:
            raise ValueError(f"word {err.args[0]!r} is not in the composition vocabulary") from None

    def decode(self, ids) -> str:
        return " ".join(self.words[int(i)] for i in ids)


@dataclass
class CompositionBatch:
    """Questions ready for a model.

    Attributes:
        tokens: `[batch pos]` ids, right-padded with `<pad>`.
        attention_mask: `[batch pos]` 1 on real tokens.
        answer_pos: `[batch]` the last real position; its next-token prediction is the answer.
        targets: `[batch]` id of the answer word.
        candidates: `[batch d_vocab]` True on the words of the answer's type.
        kinds, texts, answers: per question, the kind, the prompt text and the answer word.
    """

    tokens: Tensor
    attention_mask: Tensor
    answer_pos: Tensor
    targets: Tensor
    candidates: Tensor
    kinds: list[str]
    texts: list[str]
    answers: list[str]
    vocab: CompositionVocab


def _article(item: str) -> str:
    return "an" if item[0] in "aeiou" else "a"


def _question(rng: random.Random, vocab: CompositionVocab, kind: str, n_statements: int):
    """(prompt words, answer word, candidate words) for one question."""
    cats = rng.sample(list(vocab.categories), n_statements)
    items = [rng.choice(vocab.categories[c]) for c in cats]
    if kind == "not_kind":  # X owns all but the last item; Y owns the last one
        x, y = rng.sample(vocab.names, 2)
        owners = [x] * (n_statements - 1) + [y]
        order = list(range(n_statements))
        rng.shuffle(order)
        facts = [(owners[i], items[i]) for i in order]
        tail, answer = ["So", x, "does", "not", "have", "a", "kind", "of"], cats[-1]
    else:
        people = rng.sample(vocab.names, n_statements)
        facts = list(zip(people, items, strict=True))
        j = rng.randrange(n_statements)
        if kind == "kind":
            tail, answer = ["So", people[j], "has", "a", "kind", "of"], cats[j]
        else:
            tail, answer = ["So", "who", "has", "a", "kind", "of", cats[j], "?"], people[j]
    words = ["<bos>"]
    for person, item in facts:
        words += [person, "has", _article(item), item, "."]
    candidates = list(vocab.names) if kind == "who" else list(vocab.categories)
    return words + tail, answer, candidates


def composition_task(batch: int, kind: str = "mixed", n_statements: int = 3,
                     seed: int | None = None, vocab: CompositionVocab | None = None
                     ) -> CompositionBatch:
    """`batch` composition questions (see the module docstring).

    Args:
        kind: "kind", "not_kind", "who", or "mixed" (each question picks one at random).
        n_statements: "X has a ..." statements per question (2 to the number of categories;
            "not_kind" needs at least 2).
        seed: seeds Python's `random` for reproducible questions.

    Returns a `CompositionBatch`.
    """
    vocab = vocab or CompositionVocab()
    if kind not in (*KINDS, "mixed"):
        raise ValueError(f"kind={kind!r}; choose one of {[*KINDS, 'mixed']}")
    limit = min(len(vocab.categories), len(vocab.names))
    if not 2 <= n_statements <= limit:
        raise ValueError(f"n_statements must be in [2, {limit}], got {n_statements}")
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    rng = random.Random(seed)
    rows, kinds, answers, cands = [], [], [], []
    for _ in range(batch):
        k = rng.choice(KINDS) if kind == "mixed" else kind
        words, answer, candidates = _question(rng, vocab, k, n_statements)
        rows.append(vocab.ids(words))
        kinds.append(k)
        answers.append(answer)
        cands.append(vocab.ids(candidates))
    width = max(len(r) for r in rows)
    tokens = torch.full((batch, width), vocab.pad, dtype=torch.long)
    mask = torch.zeros(batch, width, dtype=torch.long)
    candidates = torch.zeros(batch, len(vocab), dtype=torch.bool)
    for b, row in enumerate(rows):
        tokens[b, :len(row)] = torch.tensor(row)
        mask[b, :len(row)] = 1
        candidates[b, cands[b]] = True
    return CompositionBatch(
        tokens=tokens, attention_mask=mask, answer_pos=mask.sum(1) - 1,
        targets=torch.tensor(vocab.ids(answers)), candidates=candidates, kinds=kinds,
        texts=[vocab.decode(r) for r in rows], answers=answers, vocab=vocab)


def _answer_logits(logits: Tensor, batch: CompositionBatch) -> Tensor:
    if logits.ndim != 3 or logits.shape[:2] != batch.tokens.shape:
        raise ValueError(f"logits must be [batch, pos, d_vocab] matching tokens "
                         f"{tuple(batch.tokens.shape)}, got {tuple(logits.shape)}")
    if logits.shape[-1] < len(batch.vocab):
        raise ValueError(f"logits cover {logits.shape[-1]} words, the task needs "
                         f"d_vocab >= {len(batch.vocab)}")
    rows = torch.arange(logits.shape[0], device=logits.device)
    return logits[rows, batch.answer_pos.to(logits.device)]


def predictions(logits: Tensor, batch: CompositionBatch, restrict: bool = True) -> Tensor:
    """`[batch]` predicted answer ids: argmax at `answer_pos`, over the candidates if restrict."""
    out = _answer_logits(logits, batch).float()
    if restrict:
        allowed = F.pad(batch.candidates, (0, out.shape[-1] - len(batch.vocab))).to(out.device)
        out = out.masked_fill(~allowed, float("-inf"))
    return out.argmax(-1)


def composition_accuracy(logits: Tensor, batch: CompositionBatch, restrict: bool = True) -> float:
    """Fraction of questions whose predicted answer is right (`restrict`: among its type)."""
    pred = predictions(logits, batch, restrict).cpu()
    return float((pred == batch.targets).float().mean())


def accuracy_by_kind(logits: Tensor, batch: CompositionBatch, restrict: bool = True
                     ) -> pd.DataFrame:
    """Tidy table: one row per kind with columns `kind`, `n`, `accuracy`."""
    correct = (predictions(logits, batch, restrict).cpu() == batch.targets).float()
    frame = pd.DataFrame({"kind": batch.kinds, "correct": correct.numpy()})
    out = frame.groupby("kind", sort=True)["correct"].agg(n="size", accuracy="mean")
    return out.reset_index()


def answer_loss(logits: Tensor, batch: CompositionBatch) -> Tensor:
    """Mean cross-entropy of the answer at `answer_pos` (a training objective)."""
    return F.cross_entropy(_answer_logits(logits, batch).float(),
                           batch.targets.to(logits.device))


__all__ = ["CATEGORIES", "KINDS", "NAMES", "CompositionBatch", "CompositionVocab",
           "accuracy_by_kind", "answer_loss", "composition_accuracy", "composition_task",
           "predictions"]
