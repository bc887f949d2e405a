"""The context-length curriculum (`ctx_schedule`) and starting it from a shorter run (run_fork).

The claim that lets the zoo reuse `text-mha-l2-ctx256`'s steps: a curriculum run forked from
the short run's checkpoint ends bit-identical to the same recipe trained from scratch."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from attnlens.hooked_models.model import HookedVariantTransformer
from attnlens.lab import text_recipes
from attnlens.lab.run_fork import check_fork, fork_run
from attnlens.lab.text_recipes import Recipe, train_config
from attnlens.lab.text_train import window_sampler
from attnlens.training.train_state import latest_checkpoint, read_train_state
from attnlens.training.trainer import METRICS_FILE, fit

STREAM = np.arange(20_000) % 997 + 1
VOCAB = 1000
SMALL = {"d_model": 32, "d_head": 8, "n_heads": 4}
TRAIN = {"compile": False, "eval_every": 0, "checkpoint_every": 2, "checkpoint_minutes": 0,
         "warmup": 2}


@pytest.fixture
def recipes(monkeypatch):
    """A short run (n_ctx 32, 4 rows) and a curriculum (n_ctx 64, 2 rows: 4 steps at 32)."""
    short = Recipe("t-short", "mha", "l2", arch_overrides={**SMALL, "n_ctx": 32},
                   train_overrides={**TRAIN, "steps": 4, "batch_size": 4})
    cur = Recipe("t-cur", "mha", "l2", {"ctx_schedule": ((4, 32),)},
                 arch_overrides={**SMALL, "n_ctx": 64},
                 train_overrides={**TRAIN, "steps": 6, "batch_size": 2})
    for r in (short, cur):
        monkeypatch.setitem(text_recipes.CALIBRATION_RECIPES, r.name, r)
    return short, cur


def train(recipe: Recipe, run_dir, card: dict | None = None) -> HookedVariantTransformer:
    model = HookedVariantTransformer(recipe.config(d_vocab=VOCAB))
    mix = dict(recipe.data_mix or {})
    ckpt = latest_checkpoint(run_dir)
    start = read_train_state(ckpt)["step"] if ckpt else 0
    sample = window_sampler(STREAM, model.cfg.n_ctx, 0, vocab_size=VOCAB, start_step=start,
                            **mix)
    fit(model, sample, train_config(recipe.train_overrides, progress=False), run_dir=run_dir,
        card=card or {"data_mix": "natural text"})
    return model


def test_ctx_schedule_serves_short_windows_with_the_tokens_of_a_full_step():
    sample = window_sampler(STREAM, 64, 0, ctx_schedule=((2, 16), (1, 32)))
    gen = torch.Generator().manual_seed(0)
    shapes = [tuple(sample(2, gen)[0].shape) for _ in range(4)]
    assert shapes == [(8, 16), (8, 16), (4, 32), (2, 64)]
    # the short phase draws what a run at that n_ctx with as many rows draws
    a = window_sampler(STREAM, 64, 0, ctx_schedule=((1, 16),))(2, torch.Generator().manual_seed(3))
    b = window_sampler(STREAM, 16, 0)(8, torch.Generator().manual_seed(3))
    assert torch.equal(a[0], b[0])
    with pytest.raises(ValueError, match="ctx_schedule phase"):
        window_sampler(STREAM, 64, 0, ctx_schedule=((1, 128),))
    with pytest.raises(ValueError, match="shortest context"):
        window_sampler(STREAM, 64, 0, ctx_schedule=((1, 16),), repeat_fraction=0.5,
                       span=(5, 20))


def test_a_forked_curriculum_run_ends_identical_to_one_trained_from_scratch(recipes, tmp_path):
    short, cur = recipes
    torch.set_num_threads(1)
    train(short, tmp_path / "short")
    src = latest_checkpoint(tmp_path / "short")
    assert read_train_state(src)["step"] == 4
    forked = fork_run(src, cur.name, tmp_path / "out")
    card = json.loads((forked / "card.json").read_text())
    assert card["forked_from"]["step"] == 4 and card["forked_from"]["recipe"] is None
    assert len((forked.parent / METRICS_FILE).read_text().splitlines()) == 4
    resumed = train(cur, forked.parent)
    scratch = train(cur, tmp_path / "scratch")
    assert read_train_state(latest_checkpoint(forked.parent))["step"] == 6
    for (name, p), q in zip(resumed.state_dict().items(), scratch.state_dict().values(),
                            strict=True):
        assert torch.equal(p, q), name


def test_a_fork_refuses_what_would_not_be_the_same_run(recipes, tmp_path, monkeypatch):
    short, cur = recipes
    train(short, tmp_path / "short")
    src = latest_checkpoint(tmp_path / "short")
    check_fork(src, cur.name)
    fork_run(src, cur.name, tmp_path / "out")
    with pytest.raises(ValueError, match="already holds a run"):
        fork_run(src, cur.name, tmp_path / "out")
    bad = {
        "another model": Recipe("t-x", "mha", "l2", {"ctx_schedule": ((4, 32),)},
                                arch_overrides={**SMALL, "n_ctx": 64, "d_head": 16,
                                                "n_heads": 2},
                                train_overrides={**TRAIN, "steps": 6, "batch_size": 2}),
        "first phase": Recipe("t-x", "mha", "l2", {"ctx_schedule": ((3, 32),)},
                              arch_overrides={**SMALL, "n_ctx": 64},
                              train_overrides={**TRAIN, "steps": 6, "batch_size": 2}),
        "rows per step": Recipe("t-x", "mha", "l2", {"ctx_schedule": ((4, 32),)},
                                arch_overrides={**SMALL, "n_ctx": 64},
                                train_overrides={**TRAIN, "steps": 6, "batch_size": 4}),
        "another train config": Recipe("t-x", "mha", "l2", {"ctx_schedule": ((4, 32),)},
                                       arch_overrides={**SMALL, "n_ctx": 64},
                                       train_overrides={**TRAIN, "steps": 6, "batch_size": 2,
                                                        "lr": 1e-3}),
        "trained on": Recipe("t-x", "mha", "l2", {"ctx_schedule": ((4, 32),),
                                                  "repeat_fraction": 0.5, "span": (2, 8)},
                             arch_overrides={**SMALL, "n_ctx": 64},
                             train_overrides={**TRAIN, "steps": 6, "batch_size": 2}),
        "lr schedule differs": Recipe("t-x", "mha", "l2", {"ctx_schedule": ((4, 32),)},
                                      arch_overrides={**SMALL, "n_ctx": 64},
                                      train_overrides={**TRAIN, "steps": 6, "batch_size": 2,
                                                       "cooldown": 4}),
    }
    for why, recipe in bad.items():
        monkeypatch.setitem(text_recipes.CALIBRATION_RECIPES, "t-x", recipe)
        with pytest.raises(ValueError, match=why):
            check_fork(src, "t-x")
    with pytest.raises(ValueError, match="not a training checkpoint"):
        check_fork(tmp_path, cur.name)


def test_the_zoo_curriculum_continues_ctx256_at_the_zoo_context():
    """text-mha-l2's first 6,250 steps are text-mha-l2-ctx256's: the same model but n_ctx, the
    same optimiser, 16 windows of 256 per step, then 8 x 512: the zoo's 41M tokens."""
    cur = text_recipes.get_recipe("text-mha-l2")
    ctx = text_recipes.get_recipe("text-mha-l2-ctx256")
    a, b = cur.config(d_vocab=4096).to_dict(), ctx.config(d_vocab=4096).to_dict()
    assert {k for k in a if a[k] != b[k]} == {"n_ctx", "metadata"} and a["n_ctx"] == 512
    ta, tb = train_config(cur.train_overrides), train_config(ctx.train_overrides)
    assert ta.batch_size * 512 == tb.batch_size * 256 == 4096
    assert ta.steps * 4096 == 5000 * 16 * 512 and cur.data_mix["ctx_schedule"] == ((6250, 256),)


def test_queue_status_tells_a_current_release_from_an_older_recipes(tmp_path):
    """A model shipped before its recipe changed is not reported as done."""
    from attnlens.lab.text_train import queue_status

    def ship(name, tcfg):
        (tmp_path / name).mkdir()
        (tmp_path / name / "card.json").write_text(json.dumps(
            {"seed": 0, "train_config": json.loads(json.dumps(tcfg.to_dict()))}))

    ship("text-mha-l1", train_config(None))      # the first recipe: 16 x 512 from the start
    ship("text-mha-l2", train_config(text_recipes.get_recipe("text-mha-l2").train_overrides))
    rows = {r["recipe"]: r["released"] for r in queue_status(
        tmp_path / "runs", ["text-mha-l1", "text-mha-l2", "text-cope-l1"], tmp_path)}
    assert rows == {"text-mha-l1": "older recipe", "text-mha-l2": "current",
                    "text-cope-l1": None}
