"""Passkey retrieval task: prompt shape, exact length, key depth, accuracy, evaluation sweep."""

import pytest
import torch
import torch.nn.functional as F

from attnlens.hooked_models import CharTokenizer
from attnlens.interp.tasks.passkey import (
    FILLER,
    INTRO,
    QUESTION,
    evaluate_passkey,
    passkey_accuracy,
    passkey_task,
    predict,
)

from helpers import tiny_model

TOK = CharTokenizer()



@pytest.mark.parametrize("length", [400, 517, 2000])
def test_prompt_shape_and_exact_length(length):
    batch = passkey_task(3, length, 0.5, TOK, seed=0)
    assert batch.tokens.shape == (3, length) and batch.answer_mask.shape == (3, length)
    for row, key, kp in zip(batch.tokens, batch.keys, batch.key_pos, strict=True):
        assert row[0] == TOK.bos_token_id and len(key) == 5 and key.isdigit()
        text = TOK.decode(row[1:])
        assert text.startswith(INTRO + FILLER[:20])
        assert text.endswith(QUESTION + " " + key)
        assert TOK.decode(row[kp:]).startswith(f" The pass key is {key}. Remember it. {key} is")
        assert TOK.decode(row[batch.answer_mask[0]]) == key
    assert len(set(batch.keys)) == 3


def test_depth_moves_the_key():
    positions = [int(passkey_task(1, 1500, d, TOK, seed=3).key_pos) for d in (0, .25, .5, .75, 1)]
    assert positions == sorted(positions) and len(set(positions)) == 5
    start = passkey_task(1, 1500, 0.0, TOK, seed=3)
    assert int(start.key_pos) == 1 + len(INTRO)          # right after the introduction
    end = passkey_task(1, 1500, 1.0, TOK, seed=3)
    line = len(f" The pass key is {end.keys[0]}. Remember it. {end.keys[0]} is the pass key.")
    assert int(end.key_pos) + line == 1500 - len(QUESTION) - 1 - 5   # right before the question


def test_hf_style_tokenizer_and_no_bos():
    class HFLike:
        bos_token_id = 0

        def encode(self, text, add_special_tokens=True):
            return ([0] if add_special_tokens else []) + TOK.encode(text)

    batch = passkey_task(2, 400, 0.3, HFLike(), seed=1, bos=False, n_digits=4)
    assert batch.tokens.shape == (2, 400) and (batch.tokens != 0).all()
    assert all(len(k) == 4 for k in batch.keys)


def test_accuracy_metric():
    batch = passkey_task(2, 300, 0.5, TOK, seed=0)
    perfect = F.one_hot(batch.tokens[:, 1:], TOK.vocab_size).float()
    logits = torch.cat([perfect, torch.zeros(2, 1, TOK.vocab_size)], 1)
    assert passkey_accuracy(logits, batch) == 1.0
    assert passkey_accuracy(logits, batch, exact=True) == 1.0
    pred = logits[:, :-1].argmax(-1)
    last_digit = batch.answer_mask[0].nonzero()[-1, 0] - 1
    pred[0, last_digit] = (pred[0, last_digit] + 1) % TOK.vocab_size
    pred[1, :50] = 0   # errors outside the key do not count
    assert passkey_accuracy(pred, batch) == pytest.approx(1 - 1 / 10)
    assert passkey_accuracy(pred, batch, exact=True) == 0.5
    with pytest.raises(ValueError, match="predictions"):
        passkey_accuracy(pred[:, :10], batch)


@pytest.mark.parametrize("bad,needle", [(dict(length=100), "too short"),
                                        (dict(depth=1.5), "depth"),
                                        (dict(batch=0), "batch")])
def test_bad_arguments(bad, needle):
    args = dict(batch=1, length=400, depth=0.5, tokenizer=TOK)
    with pytest.raises(ValueError, match=needle):
        passkey_task(**{**args, **bad})


def _infini(n_ctx):
    return tiny_model("infini", n_ctx=n_ctx, d_vocab=TOK.vocab_size,
                      tokenizer_alphabet=TOK.alphabet, positional_embedding_type="rotary",
                      attn_cfg={"segment_len": 64})


def test_streamed_predictions_match_one_shot_and_sweep():
    batch = passkey_task(2, 300, 0.5, TOK, seed=0)
    one_shot = predict(_infini(512), batch)
    small = _infini(128)
    streamed = predict(small, batch, chunk=100)         # 300 > n_ctx=128: goes through the stream
    torch.testing.assert_close(streamed, one_shot)
    table = evaluate_passkey(small, lengths=[260, 300], depths=(0.0, 1.0), n=2)
    assert list(table.columns) == ["length", "depth", "n", "token_accuracy", "exact_accuracy"]
    assert len(table) == 4 and table.token_accuracy.between(0, 1).all()
