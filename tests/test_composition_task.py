"""The synthetic composition task: well-formed questions, correct answers, the accuracy metric."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from attnlens.interp.tasks.composition import (
    CompositionVocab,
    accuracy_by_kind,
    answer_loss,
    composition_accuracy,
    composition_task,
    predictions,
)

from helpers import tiny_model


def _solve(text: str, vocab: CompositionVocab) -> str:
    """Answer a question from its text alone (an independent solver)."""
    words = text.split()
    body, query = words[1:words.index("So")], words[words.index("So") + 1:]
    facts = [(body[i], body[i + 3]) for i in range(0, len(body), 5)]
    assert all(body[i + 1] == "has" and body[i + 4] == "." for i in range(0, len(body), 5))
    owned = {}
    for person, item in facts:
        owned.setdefault(person, set()).add(vocab.category_of[item])
    if query[0] == "who":
        return next(p for p, cats in owned.items() if query[-2] in cats)
    mentioned = set().union(*owned.values())
    if query[1:3] == ["does", "not"]:
        (answer,) = mentioned - owned[query[0]]
        return answer
    (answer,) = owned[query[0]]
    return answer


@pytest.mark.parametrize("kind", ["kind", "not_kind", "who", "mixed"])
@pytest.mark.parametrize("n_statements", [2, 3, 4])
def test_questions_are_well_formed_and_answers_correct(kind, n_statements):
    batch = composition_task(40, kind=kind, n_statements=n_statements, seed=1)
    vocab = batch.vocab
    assert batch.tokens.shape[0] == 40 and batch.targets.shape == (40,)
    for b in range(40):
        n = int(batch.attention_mask[b].sum())
        assert int(batch.answer_pos[b]) == n - 1
        assert (batch.tokens[b, n:] == vocab.pad).all() and batch.tokens[b, 0] == vocab.bos
        assert vocab.decode(batch.tokens[b, :n]) == batch.texts[b]
        assert _solve(batch.texts[b], vocab) == batch.answers[b]
        assert vocab.words[int(batch.targets[b])] == batch.answers[b]
        assert batch.candidates[b, batch.targets[b]]
        if kind != "mixed":
            assert batch.kinds[b] == kind
    if kind == "mixed":
        assert set(batch.kinds) == {"kind", "not_kind", "who"}


def test_seeded_and_varied():
    a, b = composition_task(8, seed=3), composition_task(8, seed=3)
    assert torch.equal(a.tokens, b.tokens) and a.texts == b.texts
    assert composition_task(8, seed=4).texts != a.texts
    assert len(set(a.texts)) == 8


def test_accuracy_metric():
    batch = composition_task(12, seed=0)
    V, T = len(batch.vocab) + 5, batch.tokens.shape[1]  # a model vocabulary may be larger
    perfect = torch.zeros(12, T, V)
    perfect[torch.arange(12), batch.answer_pos, batch.targets] = 5.0
    assert composition_accuracy(perfect, batch) == 1.0
    assert torch.equal(predictions(perfect, batch), batch.targets)
    distracted = perfect.clone()
    distracted[torch.arange(12), batch.answer_pos, batch.vocab.ids(["has"])[0]] = 9.0
    assert composition_accuracy(distracted, batch, restrict=True) == 1.0
    assert composition_accuracy(distracted, batch, restrict=False) == 0.0
    half = perfect.clone()
    half[:6] = 0
    half[torch.arange(6), batch.answer_pos[:6], batch.targets[(torch.arange(6) + 1) % 12]] = 5.0
    wrong = (batch.targets[(torch.arange(6) + 1) % 12] != batch.targets[:6]).float().mean()
    assert composition_accuracy(half, batch) == pytest.approx(1 - 0.5 * float(wrong))
    table = accuracy_by_kind(perfect, batch)
    assert isinstance(table, pd.DataFrame) and list(table.columns) == ["kind", "n", "accuracy"]
    assert table["n"].sum() == 12 and (table["accuracy"] == 1.0).all()
    assert answer_loss(perfect, batch) < answer_loss(torch.zeros_like(perfect), batch)


def test_errors():
    with pytest.raises(ValueError, match="kind"):
        composition_task(2, kind="why")
    with pytest.raises(ValueError, match="n_statements"):
        composition_task(2, n_statements=1)
    batch = composition_task(2, seed=0)
    with pytest.raises(ValueError, match="logits"):
        composition_accuracy(torch.zeros(2, 3, 100), batch)
    with pytest.raises(ValueError, match="d_vocab"):
        composition_accuracy(torch.zeros(2, batch.tokens.shape[1], 10), batch)
    with pytest.raises(ValueError, match="not in the composition vocabulary"):
        batch.vocab.ids(["zebra"])


def test_runs_on_a_dcmha_model():
    batch = composition_task(4, seed=0)
    model = tiny_model("dcmha", d_vocab=len(batch.vocab), positional_embedding_type="rotary")
    logits = model(batch.tokens, attention_mask=batch.attention_mask)
    assert 0.0 <= composition_accuracy(logits, batch) <= 1.0
    assert torch.isfinite(answer_loss(logits, batch))
