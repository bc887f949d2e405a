"""Two-attribute lookup: a task whose answer needs two heads' attention patterns combined.

Records `colour shape value` follow BOS; then `? colour shape` asks for the value of the one
record with both attributes. The other records are distractors that share exactly one attribute
with the query and come in pairs with the *same* value: one record with the query's colour and
value v, one with the query's shape and the same v (plus fillers that share nothing). So

- a head matching colours spreads its weight over the target and the colour-distractors, a head
  matching shapes over the target and the shape-distractors; adding the two heads' *outputs*
  (what plain multi-head attention does in the residual stream) gives every candidate value the
  same total weight, a tie, at best chance 1 / (pairs + 1);
- adding the two heads' *logits* before the softmax (DCMHA's pre-softmax Compose, paper
  Theorem 2.1) puts the weight on the target alone.

A single head can also match both attributes, but its QK circuit then needs rank
n_colours + n_shapes: with d_head < n_colours + n_shapes one head cannot, two composed can.

Example:
    >>> batch = conjunction_task(2, seed=0)
    >>> batch.tokens.shape, batch.vocab[int(batch.tokens[0, -1])] == batch.answers[0]
    (torch.Size([2, 23]), True)
    >>> logits = torch.zeros(2, 23, len(batch.vocab))
    >>> 0.0 <= conjunction_accuracy(logits, batch) <= 1.0
    True
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
from torch import Tensor

BOS, QUERY = "<bos>", "?"


def conjunction_vocab(n_colours: int = 8, n_shapes: int = 8, n_values: int = 16
                      ) -> tuple[str, ...]:
    """`<bos> ? c0.. s0.. v0..`: one token per word."""
    return (BOS, QUERY, *(f"c{i}" for i in range(n_colours)),
            *(f"s{i}" for i in range(n_shapes)), *(f"v{i}" for i in range(n_values)))


@dataclass
class ConjunctionBatch:
    """Lookups with their answer appended (teacher forcing).

    Attributes:
        tokens: `[batch pos]` ids: BOS, records, `? colour shape`, answer value.
        answer_mask: `[batch pos]` True at the answer (the last position).
        target_record: `[batch]` index of the record with both attributes.
        candidates: `[d_vocab]` True on the value words (the answer's type).
        answers: the answer words; vocab: the id -> word table.
    """

    tokens: Tensor
    answer_mask: Tensor
    target_record: Tensor
    candidates: Tensor
    answers: list[str]
    vocab: tuple[str, ...]


def conjunction_task(batch: int, n_records: int = 6, n_pairs: int = 2, n_colours: int = 8,
                     n_shapes: int = 8, n_values: int = 16, seed: int | None = None,
                     twin_target: bool = False) -> ConjunctionBatch:
    """`batch` lookups of `n_records` records, `n_pairs` distractor pairs each.

    Each pair is a colour-distractor and a shape-distractor with one shared value; the
    remaining `n_records - 1 - 2 n_pairs` records (fillers) share no attribute with the query.
    Records are shuffled; (colour, shape) pairs never repeat within a sample.

    With `twin_target`, the first filler carries the target's value, so the target's value is
    written twice like every pair's: without it the target's value is the only one that
    occurs once among the records sharing an attribute with the query, a cue that names the
    target without the conjunction (a model can count duplicates). The draws are the same as
    without it; only that filler's value changes. Needs at least one filler.
    """
    if twin_target and n_records < 2 + 2 * n_pairs:
        raise ValueError(f"twin_target needs a filler record: n_records >= 2 + 2 * n_pairs = "
                         f"{2 + 2 * n_pairs}, got n_records={n_records}")
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    if n_pairs < 1 or n_records < 1 + 2 * n_pairs:
        raise ValueError(f"need n_pairs >= 1 and n_records >= 1 + 2 * n_pairs, got "
                         f"n_records={n_records}, n_pairs={n_pairs}")
    n_fill = n_records - 1 - 2 * n_pairs
    if min(n_colours, n_shapes) < n_pairs + 1 + (1 if n_fill else 0):
        raise ValueError(f"n_colours and n_shapes must be >= {n_pairs + 1 + bool(n_fill)} "
                         f"for {n_pairs} pairs, got {n_colours}, {n_shapes}")
    if n_values < n_pairs + 1 + n_fill:
        raise ValueError(f"n_values must be >= {n_pairs + 1 + n_fill}, got {n_values}")
    vocab = conjunction_vocab(n_colours, n_shapes, n_values)
    index = {w: i for i, w in enumerate(vocab)}
    rng = random.Random(seed)
    rows, targets, answers = [], [], []
    for _ in range(batch):
        colours, shapes = rng.sample(range(n_colours), n_colours), rng.sample(range(n_shapes),
                                                                           n_shapes)
        c, s = colours[0], shapes[0]
        values = rng.sample(range(n_values), n_pairs + 1 + n_fill)
        records = [(c, s, values[0])]
        for i in range(n_pairs):   # same value under the query's colour and the query's shape
            records += [(c, shapes[1 + i], values[1 + i]), (colours[1 + i], s, values[1 + i])]
        others_c, others_s = colours[1:], shapes[1:]   # not the query's attributes
        used = {(r[0], r[1]) for r in records}
        for v in values[n_pairs + 1:]:
            while True:
                pair = (rng.choice(others_c), rng.choice(others_s))
                if pair not in used:
                    break
            used.add(pair)
            records.append((*pair, v))
        if twin_target:
            records[1 + 2 * n_pairs] = (*records[1 + 2 * n_pairs][:2], values[0])
        order = list(range(n_records))
        rng.shuffle(order)
        words = [BOS]
        for i in order:
            rc, rs, rv = records[i]
            words += [f"c{rc}", f"s{rs}", f"v{rv}"]
        words += [QUERY, f"c{c}", f"s{s}", f"v{values[0]}"]
        rows.append([index[w] for w in words])
        targets.append(order.index(0))
        answers.append(f"v{values[0]}")
    tokens = torch.tensor(rows)
    mask = torch.zeros_like(tokens, dtype=torch.bool)
    mask[:, -1] = True
    candidates = torch.tensor([w.startswith("v") for w in vocab])
    return ConjunctionBatch(tokens, mask, torch.tensor(targets), candidates, answers, vocab)


def conjunction_accuracy(logits: Tensor, batch: ConjunctionBatch, restrict: bool = True) -> float:
    """Fraction of lookups whose predicted answer (argmax before the answer) is right.

    `logits` are `[batch pos d_vocab]` for `batch.tokens`; with `restrict`, the argmax runs over
    the value words only.
    """
    if logits.ndim != 3 or logits.shape[:2] != batch.tokens.shape:
        raise ValueError(f"logits must be [batch, pos, d_vocab] matching tokens "
                         f"{tuple(batch.tokens.shape)}, got {tuple(logits.shape)}")
    if logits.shape[-1] < len(batch.vocab):
        raise ValueError(f"logits cover {logits.shape[-1]} words, the task needs "
                         f"d_vocab >= {len(batch.vocab)}")
    out = logits[:, -2, :len(batch.vocab)].float()
    if restrict:
        out = out.masked_fill(~batch.candidates.to(out.device), float("-inf"))
    return float((out.argmax(-1).cpu() == batch.tokens[:, -1]).float().mean())


__all__ = ["ConjunctionBatch", "conjunction_accuracy", "conjunction_task", "conjunction_vocab"]
