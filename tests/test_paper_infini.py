"""Infini-attention passkey recipe of the paper-task zoo: tokenizer, batches, metrics, report."""

from __future__ import annotations

import pytest
import torch

from attnlens.interp.tasks.passkey import KEY_LINE, PasskeyTokenizer, passkey_accuracy, passkey_task
from attnlens.lab.paper import infini
from attnlens.lab.paper._training import build_model
from attnlens.reports.reproduction import infini as infini_report


def test_word_tokenizer_round_trip_and_digits():
    tok = PasskeyTokenizer()
    ids = tok.encode(KEY_LINE.format(key="9054"))
    assert tok.decode(ids) == "The pass key is 9 0 5 4 . Remember it . 9 0 5 4 is the pass key ."
    assert tok.encode(" ") == [] and tok.encode("12") == [2, 3]
    assert len(set(tok.words)) == len(tok.words) == tok.vocab_size
    with pytest.raises(ValueError, match="'banana' is not in the passkey vocabulary"):
        tok.encode("The banana")


def test_passkey_batch_with_word_tokens():
    tok = PasskeyTokenizer()
    batch = passkey_task(4, 200, 0.5, tok, seed=0)
    assert batch.tokens.shape == (4, 200)
    for row, key, mask in zip(batch.tokens, batch.keys, batch.answer_mask, strict=True):
        assert tok.decode(row[mask]) == " ".join(key)
    logits = torch.nn.functional.one_hot(batch.tokens[:, 1:], tok.vocab_size).float()
    logits = torch.cat([logits, torch.zeros(4, 1, tok.vocab_size)], 1)   # perfect predictions
    assert passkey_accuracy(logits, batch, exact=True) == 1.0


def test_recipes_and_sampler():
    assert set(infini.RECIPES) == {"infini-passkey-s0", "infini-passkey-s1",
                                   *(f"infini-passkey-long-s{s}" for s in infini.LONG_SEEDS)}
    recipe = infini.RECIPES["infini-passkey-s0"]
    assert recipe.config["n_ctx"] == infini.TRAIN_LENGTH > 2 * infini.SEGMENT_LEN
    tokens, weights = infini.sampler(recipe)(3, torch.Generator().manual_seed(0))
    assert tokens.shape == (3, infini.TRAIN_LENGTH)
    assert weights.shape == (3, infini.TRAIN_LENGTH - 1)
    # the 5 answer digits weigh answer_weight, every other target 1
    assert (weights == recipe.task_args["answer_weight"]).sum(1).tolist() == [5, 5, 5]
    assert int((weights == 1).sum()) == 3 * (infini.TRAIN_LENGTH - 6)


def test_evaluate_is_deterministic_and_complete(monkeypatch):
    """Every key, on 2 prompts per cell instead of EVAL_N (the keys and ranges do not depend on
    the count; the shipped card's re-evaluation in test_paper_zoo.py runs the full EVAL_N)."""
    torch.set_num_threads(1)
    recipe = infini.RECIPES["infini-passkey-s0"]
    model = build_model(recipe).eval()
    full = infini.evaluate_passkey
    monkeypatch.setattr(infini, "evaluate_passkey", lambda *a, **kw: full(*a, **{**kw, "n": 2}))
    metrics = infini.evaluate(model, recipe)
    for f in infini.FACTORS:
        assert 0.0 <= metrics[f"acc_x{f}"] <= 1.0
        for d in infini.DEPTHS:
            assert f"acc_x{f}_d{d:.2f}" in metrics
    # an untrained model has every gate at sigmoid(0) = 0.5: all mixers
    assert metrics["heads_mixer"] == 8 and metrics["gate_L1H3"] == 0.5
    assert infini.grid(model, n=2).equals(infini.grid(model, n=2))


def _card(seed: int, acc_near: float, acc_far: float) -> dict:
    metrics = {}
    for f in infini.FACTORS:
        acc = acc_near if f == 1 else acc_far
        metrics[f"acc_x{f}"] = acc
        metrics.update({f"acc_x{f}_d{d:.2f}": acc for d in infini.DEPTHS})
        for d in infini.DEPTHS:
            metrics[f"exact_x{f}_d{d:.2f}"] = acc / 2
        metrics[f"exact_x{f}"] = acc / 2
    for f in infini.FACTORS:
        for kind in ("acc", "exact"):
            metrics[f"ko_{kind}_x{f}"] = 0.1
            metrics.update({f"ko_{kind}_x{f}_d{d:.2f}": 0.1 for d in infini.DEPTHS})
    metrics.update(heads_memory=2.0, heads_local=1.0, heads_mixer=3.0, heads_intermediate=2.0)
    return {"seed": seed, "metrics": metrics}


def test_report_section_reports_the_grid_honestly():
    text = infini_report.report_section([_card(0, 0.95, 0.2), _card(1, 0.9, 0.1)])
    assert "| 16x (2560) |" in text and "0.15 [0.00, 0.79] (n=2) / 0.08 [0.00, 0.39] (n=2)" in text
    assert "| 1x (160), memory read zeroed |" in text
    assert "does **not** reproduce" in text and "2 memory, 1 local, 3 mixer" in text
    assert "**reproduces**" in infini_report.report_section([_card(0, 1.0, 0.95)])
    assert "No evaluated" in infini_report.report_section([{"seed": 0}])


def test_one_seed_is_said_and_not_printed_as_a_range():
    """Item 19: one seed gives no "seeds separated by /" and no "1.00-1.00" ranges."""
    text = infini_report.report_section([_card(0, 1.0, 0.3)])
    assert "separated by /" not in text and "1.00-1.00" not in text
    assert "1 seed (seed 0), no interval" in text and "1.00 (1 seed, no interval)" in text


def test_reading_reports_exact_keys_and_the_knockout_baseline():
    """Item 15: whole-key accuracy beside token accuracy, and the memory knock-out."""
    text = infini_report.reading(infini.PHENOMENON, [_card(0, 1.0, 0.3)])
    assert "exact key 0.50 (1 seed, no interval)" in text
    assert "with the memory read zeroed, 1x drops to token 0.10" in text
    assert "whole-key accuracy only 0.15" in text


def test_memory_knockout_changes_the_output():
    torch.set_num_threads(1)
    recipe = infini.RECIPES["infini-passkey-s0"]
    model = build_model(recipe).eval()
    with torch.no_grad():
        tokens = passkey_task(2, infini.TRAIN_LENGTH, 0.0, infini.TOKENIZER, seed=0).tokens
        plain = model(tokens)
        with model.hooks(fwd_hooks=infini.memory_knockout_hooks(model)):
            knocked = model(tokens)
    assert (plain - knocked).abs().max() > 1e-4


def test_grid_figure(tmp_path):
    fig = infini_report.grid_figure([_card(0, 0.9, 0.3), _card(1, 0.7, 0.1)])
    z = fig.data[0].z                              # token accuracy, mean of the seeds
    assert len(z) == len(infini.FACTORS) and z[0][0] == pytest.approx(0.8)
    assert z[-1][-1] == pytest.approx(0.2)
    exact = fig.data[1].z                          # exact key
    assert exact[0][0] == pytest.approx(0.4) and exact[-1][-1] == pytest.approx(0.1)


def test_long_recipes_train_on_a_length_curriculum_and_stop_early(tmp_path):
    """Issue 24 item 2: lengths of 5-20 segments, one per batch, replayable; validation
    prompts from seeds no training or evaluation batch uses; early stopping on their loss."""
    from attnlens.lab.paper import _training

    recipe = infini.RECIPES["infini-passkey-long-s1"]
    assert recipe.config["n_ctx"] == max(infini.LONG_LENGTHS)
    assert len(infini.LONG_SEEDS) >= 3 and recipe.train["early_stop_patience"] > 0
    sample, gen = infini.sampler(recipe), torch.Generator().manual_seed(recipe.seed)
    lengths = [sample(2, gen)[0].shape[1] for _ in range(30)]
    assert set(lengths) == set(infini.LONG_LENGTHS)
    gen = torch.Generator().manual_seed(recipe.seed)
    drawn = [infini._drawer(recipe)(gen) for _ in range(30)]
    assert [length for length, *_ in drawn] == lengths
    assert infini.batch_seeds(recipe)[:30] == [seed for *_, seed in drawn]
    val = set(range(infini.VAL_SEED, infini.VAL_SEED + 2 * len(infini.LONG_LENGTHS)))
    assert not val & set(_training.eval_seeds()) and not val & set(infini.batch_seeds(recipe))
    # the short recipes still draw exactly as before (no length draw)
    short = infini.RECIPES["infini-passkey-s0"]
    gen = torch.Generator().manual_seed(0)
    assert infini.batch_seeds(short)[:5] == [infini._draw(gen)[1] for _ in range(5)]
    tiny = _training.Recipe(
        name="infini-tiny-long-s0", phenomenon="infini-passkey-long", variant="infini",
        task="tiny", seed=0, config={**recipe.config, "n_ctx": 160, "n_layers": 1},
        train=dict(steps=300, batch_size=4, lr=3e-3, warmup=1, eval_every=2,
                   early_stop_patience=1, early_stop_min_delta=100.0),
        task_args={**recipe.task_args, "lengths": [96, 160]}, module="infini")
    _training.train_recipe(tiny, tmp_path / "model", infini.sampler(tiny), resume=False,
                           run_root=tmp_path / "runs", evaluate=infini.validation(tiny, n=2))
    import json

    card = json.loads((tmp_path / "model" / "card.json").read_text())
    assert card["stopped_early"] is True and card["steps"] == 4


def test_eval_data_seeds_are_the_seeds_evaluate_draws_from(monkeypatch):
    """The held-out check (tests/test_paper_report.py) trusts `eval_data_seeds`: it must list
    every seed `evaluate` builds prompts from, and nothing else."""
    from attnlens.interp.tasks import passkey

    seen: set[int] = set()
    original = passkey.passkey_task

    def recording(batch, length, depth, tokenizer, *args, seed, **kwargs):
        seen.add(seed)
        return original(1, length, depth, tokenizer, *args, seed=seed, **kwargs)   # 1 prompt

    monkeypatch.setattr(passkey, "passkey_task", recording)
    monkeypatch.setattr(infini, "passkey_task", recording)
    model = build_model(infini.RECIPES["infini-passkey-s0"]).eval()
    infini.evaluate(model, infini.RECIPES["infini-passkey-s0"])
    assert seen == infini.eval_data_seeds()
