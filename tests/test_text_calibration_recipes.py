"""Calibration recipes (issue 26 item 2): the 2-layer MHA with one thing changed, same tokens."""

from __future__ import annotations

import pytest

from attnlens.lab.text_recipes import (
    CALIBRATION_RECIPES,
    LR_RECIPES,
    PACKAGE_RECIPES,
    RECIPES,
    REPLICATE_SEEDS,
    SEED_RECIPES,
    SESSION_CALIBRATION,
    ZOO_TRAIN,
    get_recipe,
    run_seed,
    train_config,
)


def tokens_of(recipe) -> int:
    cfg = recipe.config(d_vocab=4096)
    tcfg = train_config(recipe.train_overrides)
    return tcfg.steps * tcfg.batch_size * cfg.n_ctx


@pytest.mark.parametrize("name", sorted(set(CALIBRATION_RECIPES) - set(SESSION_CALIBRATION)
                                         - set(PACKAGE_RECIPES) - set(LR_RECIPES)))
def test_calibration_recipes_change_one_thing_at_the_zoo_budget(name):
    recipe, zoo = get_recipe(name), RECIPES["text-mha-l2"]
    assert tokens_of(recipe) == tokens_of(zoo) == 5000 * 16 * 512
    cfg, zoo_cfg = recipe.config(d_vocab=4096), zoo.config(d_vocab=4096)
    changed = {k for k, v in vars(cfg).items() if vars(zoo_cfg)[k] != v} - {"metadata"}
    assert changed <= {"n_ctx"}
    tcfg = train_config(recipe.train_overrides)
    assert tcfg.lr == ZOO_TRAIN["lr"] and tcfg.weight_decay == ZOO_TRAIN["weight_decay"]


def test_ctx256_is_the_issue_plain_setup():
    recipe = get_recipe("text-mha-l2-ctx256")
    assert recipe.config(d_vocab=4096).n_ctx == 256
    assert train_config(recipe.train_overrides).batch_size == 16


def test_unknown_recipe_lists_the_calibration_ones():
    with pytest.raises(ValueError, match="text-mha-l2-ctx256"):
        get_recipe("text-mha-l3")


@pytest.mark.parametrize("name", sorted(SESSION_CALIBRATION))
def test_session_calibration_runs_fit_a_session_and_change_only_the_data(name):
    """The session-sized runs: the zoo's 2-layer MHA and optimiser, 4,096 tokens per step,
    at most 12.3M tokens (3,000 steps), natural text changed only by a documented mix."""
    recipe, zoo = get_recipe(name), RECIPES["text-mha-l2"]
    assert tokens_of(recipe) <= 3000 * 8 * 512
    cfg, zoo_cfg = recipe.config(d_vocab=4096), zoo.config(d_vocab=4096)
    assert {k for k, v in vars(cfg).items() if vars(zoo_cfg)[k] != v} <= {"metadata"}
    tcfg = train_config(recipe.train_overrides)
    assert tcfg.batch_size * cfg.n_ctx == 4096 and tcfg.lr == ZOO_TRAIN["lr"]
    assert recipe.data_mix and set(recipe.data_mix) <= {
        "repeat_fraction", "span", "span_tokens", "toy_schedule", "toy_copy", "toy_vocab"}


@pytest.mark.parametrize("name", sorted(PACKAGE_RECIPES))
def test_package_corpus_twins_change_only_the_training_text(name):
    """text-{v}-l2-pkgs is the zoo's text-{v}-l2 (model, optimiser, curriculum, tokens) on
    the standard library followed by the pinned distributions' sources."""
    recipe = get_recipe(name)
    zoo = RECIPES[name.removesuffix("-pkgs")]
    assert recipe.corpus == "stdlib+packages" and zoo.corpus == "stdlib"
    assert vars(recipe.config(d_vocab=4096)) | {"metadata": None} == \
        vars(zoo.config(d_vocab=4096)) | {"metadata": None}
    assert train_config(recipe.train_overrides) == train_config(zoo.train_overrides)
    assert recipe.data_mix == zoo.data_mix and tokens_of(recipe) == tokens_of(zoo)


def test_the_lr_twin_changes_only_the_learning_rate():
    recipe, zoo = get_recipe("text-dcmha-l2-lr1e3"), RECIPES["text-dcmha-l2"]
    assert vars(recipe.config(d_vocab=4096)) | {"metadata": None} == \
        vars(zoo.config(d_vocab=4096)) | {"metadata": None}
    ours, theirs = train_config(recipe.train_overrides), train_config(zoo.train_overrides)
    assert ours.lr == 1e-3 and theirs.lr == ZOO_TRAIN["lr"] == 3e-3
    assert ours.to_dict() | {"lr": None} == theirs.to_dict() | {"lr": None}
    assert recipe.data_mix == zoo.data_mix and tokens_of(recipe) == tokens_of(zoo)


@pytest.mark.parametrize("name", sorted(SEED_RECIPES))
def test_seed_replicates_are_the_zoo_recipes_with_another_seed(name):
    recipe = get_recipe(name)
    zoo = RECIPES[name.rsplit("-s", 1)[0]]
    assert (recipe.variant, recipe.shape, recipe.data_mix, recipe.train_overrides,
            recipe.corpus) == (zoo.variant, zoo.shape, zoo.data_mix, zoo.train_overrides,
                               zoo.corpus)
    assert run_seed(name, seed=0) == int(name[-1]) != 0        # the shipped models are seed 0
    assert recipe.config(d_vocab=4096, seed=1).seed == 1
    assert sorted(SEED_RECIPES) == sorted(f"text-{v}-l2-s{s}" for v in ("mha", "dcmha")
                                          for s in REPLICATE_SEEDS)
