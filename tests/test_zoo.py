"""Bundled models: they load, and the metrics in their cards are what the eval command gives."""

import json

import pytest
import torch
from tiers import documented

from attnlens.hooked_models import zoo
from attnlens.interp.tasks.zoo_induction import induction_metrics

NAMES = zoo.available(kind="induction")   # paper-task models: tests/test_paper_zoo.py


def test_zoo_is_not_empty():
    assert "induction-mha" in NAMES


@documented("toy card")
@pytest.mark.parametrize("name", NAMES)
def test_card_metrics_are_reproduced(name):
    model = zoo.load(name)
    card = json.loads((zoo.path(name) / "card.json").read_text())
    assert card["eval_command"].endswith(f"evaluate {name} --write")
    measured = induction_metrics(model)
    for key, value in card["metrics"].items():
        assert measured[key] == pytest.approx(value, abs=2e-3), key


def test_induction_circuit_in_the_mha_model():
    """The trained model has a previous-token head in layer 0 feeding induction heads in layer 1:
    zeroing that head's output collapses the layer-1 induction scores."""
    from attnlens.interp.tools.heads import ablate_heads, induction_table

    model = zoo.load("induction-mha")
    table = induction_table(model, half_len=15)
    layer0, layer1 = table[table.layer == 0], table[table.layer == 1]
    prev = layer0["previous_token"].idxmax()
    assert layer0.loc[prev, "previous_token"] > 0.5
    assert layer1["induction_stripe"].max() > 0.8
    with ablate_heads(model, [(0, int(layer0.loc[prev, "head"]))]):
        ablated = induction_table(model, half_len=15)
    drop = layer1["induction_stripe"] - ablated[ablated.layer == 1]["induction_stripe"]
    assert (drop > 0.3).all()
    assert torch.equal(torch.tensor(ablated[ablated.layer == 0]["previous_token"].to_numpy()),
                       torch.tensor(layer0["previous_token"].to_numpy()))


def test_unknown_zoo_name():
    with pytest.raises(ValueError, match="no bundled model 'nope'"):
        zoo.load("nope")


def test_unknown_zoo_name_names_the_closest_models_not_all_of_them():
    names = [f"text-{v}-l{n}" for v in ("mha", "cope", "mta") for n in (1, 2)]
    names += [f"task-model-s{s}" for s in range(10)]
    text = zoo.unknown_model_message("text-mha-l3", names)
    assert text.startswith("no bundled model 'text-mha-l3'; the closest: ")
    assert "'text-mha-l1'" in text and "'text-mha-l2'" in text and "task-model-s0" not in text
    assert "16 models are bundled: zoo.available()" in text
    assert "attnlens train --zoo text --status" in text
    text = zoo.unknown_model_message("qqq", names)
    assert "closest" not in text and "--status" not in text and "16 models" in text
    few = zoo.unknown_model_message("x", ["a", "b"])
    assert few == "no bundled model 'x'; available: ['a', 'b']"


def test_default_dashboard_text_fits_every_bundled_model():
    from attnlens.hooked_models.zoo.recipes import default_text

    for name in NAMES:
        model = zoo.load(name)
        assert model.to_tokens(default_text()).shape[1] <= model.cfg.n_ctx
