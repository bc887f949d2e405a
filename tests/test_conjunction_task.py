"""The two-attribute lookup task: unique answers, distractor pairs that defeat summed heads."""

from __future__ import annotations

import pytest
import torch

from attnlens.interp.tasks.conjunction import (
    conjunction_accuracy,
    conjunction_task,
    conjunction_vocab,
)


def _records(words: list[str]):
    body = words[1:words.index("?")]
    return [tuple(body[i:i + 3]) for i in range(0, len(body), 3)], words[-3:-1], words[-1]


@pytest.mark.parametrize("n_records,n_pairs", [(6, 2), (5, 2), (7, 3), (3, 1)])
def test_answer_is_the_unique_conjunction(n_records, n_pairs):
    batch = conjunction_task(20, n_records=n_records, n_pairs=n_pairs, seed=1)
    assert batch.tokens.shape == (20, 3 * n_records + 5)
    assert batch.answer_mask.sum(1).tolist() == [1] * 20 and batch.answer_mask[:, -1].all()
    for row, target, answer in zip(batch.tokens, batch.target_record, batch.answers,
                                   strict=True):
        records, (c, s), value = _records([batch.vocab[i] for i in row])
        assert len(records) == n_records and value == answer
        both = [r for r in records if r[0] == c and r[1] == s]
        assert both == [records[int(target)]] and both[0][2] == value
        assert len({(r[0], r[1]) for r in records}) == n_records


def test_summed_single_attribute_heads_tie():
    """Colour-matching plus shape-matching attention (outputs added) ties every candidate."""
    batch = conjunction_task(50, seed=2)
    for row in batch.tokens:
        records, (c, s), value = _records([batch.vocab[i] for i in row])
        by_colour = [r for r in records if r[0] == c]
        by_shape = [r for r in records if r[1] == s]
        assert len(by_colour) == len(by_shape) == 3
        score: dict[str, float] = {}
        for group in (by_colour, by_shape):
            for r in group:
                score[r[2]] = score.get(r[2], 0.0) + 1 / len(group)
        assert len(score) == 3 and len(set(score.values())) == 1 and value in score


def test_seeded_and_accuracy():
    a, b = conjunction_task(8, seed=5), conjunction_task(8, seed=5)
    assert torch.equal(a.tokens, b.tokens) and not torch.equal(a.tokens,
                                                               conjunction_task(8, seed=6).tokens)
    logits = torch.zeros(8, a.tokens.shape[1], len(a.vocab))
    logits[torch.arange(8), -2, a.tokens[:, -1]] = 5.0      # perfect predictions
    assert conjunction_accuracy(logits, a) == 1.0
    logits[0, -2, 0] = 99.0                                  # BOS is not a candidate value
    assert conjunction_accuracy(logits, a) == 1.0
    assert conjunction_accuracy(logits, a, restrict=False) == 7 / 8


def test_errors():
    with pytest.raises(ValueError, match="n_records >= 1"):
        conjunction_task(2, n_records=4, n_pairs=2)
    with pytest.raises(ValueError, match="batch"):
        conjunction_task(0)
    with pytest.raises(ValueError, match="n_values"):
        conjunction_task(2, n_values=3)
    with pytest.raises(ValueError, match="n_colours"):
        conjunction_task(2, n_colours=2)
    batch = conjunction_task(2, seed=0)
    with pytest.raises(ValueError, match="logits must be"):
        conjunction_accuracy(torch.zeros(2, 3, 40), batch)
    with pytest.raises(ValueError, match="d_vocab"):
        conjunction_accuracy(torch.zeros(2, batch.tokens.shape[1], 10), batch)
    assert len(conjunction_vocab()) == 2 + 8 + 8 + 16


def test_twin_target_writes_every_value_twice_and_changes_only_a_filler():
    """`twin_target`: the target's value also sits on a filler (a record sharing no attribute
    with the query), so no value is the only one of its kind; everything else is the plain
    task's draw."""
    plain, twin = conjunction_task(64, seed=3), conjunction_task(64, seed=3, twin_target=True)
    changed = (plain.tokens != twin.tokens).nonzero()
    assert len(changed) == 64                                  # one token per sample
    for row in range(64):
        records, (colour, shape), answer = _records([twin.vocab[i] for i in twin.tokens[row]])
        values = [r[2] for r in records]
        assert values.count(answer) == 2
        matching = [r[2] for r in records if r[0] == colour or r[1] == shape]
        assert all(values.count(v) == 2 for v in matching)     # no unique value to point at
        both = [r for r in records if r[0] == colour and r[1] == shape]
        assert len(both) == 1 and both[0][2] == answer
        twin_record = [r for r in records if r[2] == answer and r != both[0]][0]
        assert twin_record[0] != colour and twin_record[1] != shape
        pos = int(changed[row, 1])
        assert changed[row, 0] == row and twin.vocab[int(twin.tokens[row, pos])] == answer
    assert twin.answers == plain.answers
    assert torch.equal(twin.target_record, plain.target_record)
    with pytest.raises(ValueError, match="twin_target needs a filler"):
        conjunction_task(2, n_records=5, n_pairs=2, twin_target=True)
