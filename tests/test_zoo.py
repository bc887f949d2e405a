"""Bundled models: they load, and the metrics in their cards are what the eval command gives."""

import json

import pytest
import torch

from hooked_models import zoo
from hooked_models.zoo.evaluate import induction_metrics

NAMES = zoo.available()


def test_zoo_is_not_empty():
    assert "induction-mha" in NAMES


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
    zeroing that head's values collapses the layer-1 induction scores."""
    from dashboards.pages.heads import score_tables

    model = zoo.load("induction-mha")
    tables = score_tables(model, half_len=15)
    prev_head = int(tables["previous token"][0].argmax())
    assert tables["previous token"][0, prev_head] > 0.5
    assert tables["induction"][1].max() > 0.8

    def knock_out(v, hook):
        v[:, :, prev_head] = 0
        return v

    with model.hooks(fwd_hooks=[("blocks.0.attn.hook_v", knock_out)]):
        ablated = score_tables(model, half_len=15)
    assert (ablated["induction"][1] < tables["induction"][1] - 0.3).all()
    assert torch.equal(ablated["previous token"][0], tables["previous token"][0])


def test_unknown_zoo_name():
    with pytest.raises(ValueError, match="no bundled model 'nope'"):
        zoo.load("nope")
