"""Issue 22 item 1: every bundled checkpoint carries its tokenizer (word vocabularies saved as
tokenizer.json) and the dashboard's default prompt is an example of the model's own task."""

from __future__ import annotations

import json

import pytest
import torch

from attnlens.hooked_models import zoo
from attnlens.hooked_models.checkpoint import TOKENIZER_FILE
from attnlens.hooked_models.config import VariantConfig
from attnlens.hooked_models.model import HookedVariantTransformer
from attnlens.hooked_models.tokenizers.vocab import WordTokenizer
from attnlens.interp.tasks.prompts import example_prompt, task_tokenizer

PAPER = zoo.available("paper-task")


def test_word_tokenizer_round_trip_and_errors():
    tok = WordTokenizer(("<bos>", "<pad>", "a", "b", "++;"), pad_token="<pad>")
    assert tok.encode("a ++;  b\n a") == [2, 4, 3, 2]
    assert tok.encode(tok.decode([0, 2, 4])) == [0, 2, 4]
    assert tok("a b")["input_ids"] == [2, 3]
    assert (tok.bos_token_id, tok.pad_token_id, tok.vocab_size) == (0, 1, 5)
    with pytest.raises(ValueError, match="'c' is not in the tokenizer's vocabulary"):
        tok.encode("a c")
    with pytest.raises(ValueError, match="outside the tokenizer vocabulary"):
        tok.decode([5])
    again = WordTokenizer.from_json(tok.to_json())
    assert again.words == tok.words and again.pad_token_id == 1
    with pytest.raises(ValueError, match="not a valid word tokenizer"):
        WordTokenizer.from_json('{"type": "attnlens-word-tokenizer"}')


def test_word_tokenizer_saved_with_checkpoint(tmp_path):
    tok = task_tokenizer({"task": "flipflop"})
    cfg = VariantConfig(n_layers=1, d_model=16, n_heads=2, d_head=8, n_ctx=16, d_vocab=7,
                        attn_only=True, seed=0)
    model = HookedVariantTransformer(cfg, tokenizer=tok)
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / TOKENIZER_FILE).read_text())["words"] == list(tok.words)
    loaded = HookedVariantTransformer.from_pretrained(tmp_path)
    assert isinstance(loaded.tokenizer, WordTokenizer) and loaded.tokenizer.words == tok.words
    assert loaded.to_str_tokens("w 1 r") == ["<bos>", "w", "1", "r"]
    assert loaded.to_tokens(loaded.to_string(loaded.to_tokens("w 0 r 0")[0]),
                            prepend_bos=False).tolist() == loaded.to_tokens("w 0 r 0").tolist()
    (tmp_path / TOKENIZER_FILE).write_text(tok.to_json().replace('"w"', '"x"'))
    with pytest.raises(ValueError, match="tokenizer.json differs"):
        HookedVariantTransformer.from_pretrained(tmp_path)


def test_passkey_word_tokenizer_matches_the_task_tokenizer():
    from attnlens.interp.tasks.passkey import PasskeyTokenizer, passkey_task

    words, task = task_tokenizer({"length": 160}), PasskeyTokenizer()
    for seed, depth in ((0, 0.0), (1, 0.5), (2, 1.0)):
        a = passkey_task(2, 200, depth, task, seed=seed).tokens
        b = passkey_task(2, 200, depth, words, seed=seed).tokens
        assert torch.equal(a, b)
    assert words.decode(words.encode(" The pass key is 905.")) == "The pass key is 9 0 5 ."


@pytest.mark.parametrize("name", PAPER)
def test_every_paper_checkpoint_carries_its_tokenizer(name):
    model = zoo.load(name)
    assert model.tokenizer is not None, name
    assert model.tokenizer.vocab_size == model.cfg.d_vocab
    text = example_prompt(model.card)
    tokens = model.to_tokens(text)
    assert tokens[0, 0].item() == model.tokenizer.bos_token_id
    assert tokens.shape[1] <= model.cfg.n_ctx
    assert text == example_prompt(model.card)   # fixed seed


def test_example_prompts_are_the_tasks_own_tokens():
    from attnlens.interp.tasks.counting import counting_batch
    from attnlens.interp.tasks.find_block import FindBlockTask

    card = json.loads((zoo.path("cope-counting-3var-cope-s0") / "card.json").read_text())
    batch = counting_batch(1, n_vars=3, max_steps=32, seed=0)
    model = zoo.load("cope-counting-3var-cope-s0")
    assert model.to_tokens(example_prompt(card))[0].tolist() == batch.tokens[0].tolist()
    fb = zoo.load("mta-findblock-all-mta-s0")
    task = FindBlockTask(**fb.card["task_args"])
    assert (fb.to_tokens(example_prompt(fb.card))[0].tolist()
            == task.to_tokens(task.generate(1, seed=0)).tokens[0].tolist())


def test_dashboard_default_prompt_is_the_task_example():
    from attnlens.dashboards.store import load_store

    names = ["cope-counting-3var-cope-s0", "mta-findblock-first-mta-s0", "infini-passkey-s0",
             "dcmha-conjunction-dcmha-s0", "induction-mha"]
    store = load_store(names)
    for name in names:
        prompt = store.prompt(name, "")
        assert prompt.note == "the prompt is empty: showing the default text"
        assert prompt.tokens.shape[1] > 8
    assert store.prompt("mta-findblock-first-mta-s0", "").labels[:3] == ["0:<bos>", "1:c", "2:e"]
    assert "print" in store.default_text["cope-counting-3var-cope-s0"].split()
