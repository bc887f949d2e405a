"""The "find the block" toy task generator (MTA paper section 2 / App. C; notes 1.8)."""

import pytest
import torch

from attnlens.hooked_models import HookedVariantTransformer
from attnlens.interp.tasks.find_block import (
    CPU_TASK,
    FindBlockTask,
    answer_error_rate,
    answer_loss,
)


def check_sample(task, s):
    blocks = s.text.split("#")[0].split(".")
    assert tuple(blocks) == s.blocks and s.text.endswith("#" + s.query)
    assert len(s.query) == task.query_length == len(set(s.query))
    assert set(s.query) <= set(s.target) and len(set(s.target)) == task.block_length
    holders = [b for b in blocks if set(s.query) <= set(b)]
    assert holders == [s.target], "the target must be the only block with every query letter"
    assert len(set(blocks)) == len(blocks)
    assert set(s.text) <= set(task.alphabet + ".#")


@pytest.mark.parametrize("N, L", [(5, 2), (8, 2), (4, 3)])
def test_official_lengths_and_uniqueness(N, L):
    task = FindBlockTask(block_length=N, query_length=L)
    for s in task.generate(20, seed=1):
        check_sample(task, s)
        assert len(s.text) + len(s.label) == 319   # the official pad_len
        assert len(s.text) == task.prompt_length
    if N == 5:
        assert len(s.blocks) == 52 and all(len(b) == 5 for b in s.blocks)   # no truncation


@pytest.mark.parametrize("variant, pick", [("All", slice(None)), ("First", 0), ("Last", -1)])
def test_variants_and_loss_mask(variant, pick):
    task = FindBlockTask(**CPU_TASK, variant=variant)
    samples = task.generate(6, seed=2)
    for s in samples:
        check_sample(task, s)
        assert s.label == s.target[pick] and len(s.blocks) == CPU_TASK["n_blocks"]
    batch = task.to_tokens(samples)
    assert batch.tokens.shape == (6, task.n_tokens)
    tok = task.tokenizer()
    for row, mask, s in zip(batch.tokens, batch.loss_mask, samples, strict=True):
        assert tok.decode(row.tolist()) == "<bos>" + s.text + s.label
        assert tok.decode(row[1:][mask.bool()].tolist()) == s.label   # loss on the answer only
        assert tok.decode(row[batch.answer_start:].tolist()) == s.label


def test_reproducible_and_distinct():
    task = FindBlockTask(**CPU_TASK)
    a, b = task.generate(30, seed=3), task.generate(30, seed=3)
    assert a == b and len({s.text for s in a}) == 30
    assert task.generate(30, seed=4) != a


@pytest.mark.parametrize("kwargs, match", [
    (dict(query_length=6, block_length=5), "query_length"),
    (dict(block_length=27), "vocab_size"),
    (dict(vocab_size=30), "vocab_size"),
    (dict(variant="Middle"), "variant"),
    (dict(block_length=3, query_length=3, n_blocks=4), "no valid distractor"),
    (dict(n_blocks=0), "n_blocks"),
    (dict(seq_len=6), "no room"),
])
def test_bad_settings_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FindBlockTask(**kwargs)


def test_impossible_draws_raise():
    # 3 letters, blocks of 2 without the query letter: only 2 distinct distractors exist
    with pytest.raises(ValueError, match="distractor"):
        FindBlockTask(block_length=2, query_length=1, n_blocks=6, vocab_size=3).generate(1)


def test_models_for_the_task_train_on_the_answer():
    task = FindBlockTask(**CPU_TASK)
    assert task.mta_options()["query_kernel_size"] == 2
    assert task.mta_options()["key_kernel_size"] == 2 * CPU_TASK["block_length"] - 1
    batch = task.batch(8, seed=0)
    for attention in ("mta", "mha"):
        cfg = task.model_config(attention, d_model=32, n_layers=2, n_heads=4, seed=0)
        model = HookedVariantTransformer(cfg)
        assert model.cfg.n_ctx == batch.tokens.shape[1]
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        first = answer_loss(model, batch)
        for _ in range(5):
            opt.zero_grad()
            loss = answer_loss(model, batch)
            loss.backward()
            opt.step()
        assert answer_loss(model, batch) < first
        assert 0.0 <= answer_error_rate(model, batch) <= 1.0
