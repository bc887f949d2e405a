"""Calibration recipes (issue 26 item 2): the 2-layer MHA with one thing changed, same tokens."""

from __future__ import annotations

import pytest

from interp.zoo.text_recipes import (
    CALIBRATION_RECIPES,
    RECIPES,
    ZOO_TRAIN,
    get_recipe,
    train_config,
)


def tokens_of(recipe) -> int:
    cfg = recipe.config(d_vocab=4096)
    tcfg = train_config(recipe.train_overrides)
    return tcfg.steps * tcfg.batch_size * cfg.n_ctx


@pytest.mark.parametrize("name", sorted(CALIBRATION_RECIPES))
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
