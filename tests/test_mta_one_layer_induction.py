"""MTA's one-layer induction head (docs/circuit_discovery.md, text-mta-l2): the numbers the docs
quote, recomputed, and `attnlens.interp.variants.mta.plain_kernel`, the switch they come from."""

from __future__ import annotations

import pytest
import torch

from attnlens.hooked_models import zoo
from attnlens.interp.tools.text_eval import induction_probe, load_eval_tokens, text_repeat_probe
from attnlens.interp.variants.mta import kernel_table, plain_kernel

from helpers import tiny_model

NAME = "text-mta-l2"


def _probe(model) -> dict:
    out = induction_probe(model) | text_repeat_probe(model, load_eval_tokens(zoo.path(NAME)))
    out.pop("table")
    return out


@pytest.fixture(scope="module")
def model():
    if NAME not in zoo.available():
        pytest.skip(f"{NAME} is not shipped")
    return zoo.load(NAME)


def test_l0h3_kernel_is_the_previous_key_diagonal(model):
    row = kernel_table(model).set_index(["head_label", "phase"]).loc[("L0H3", "pre")]
    assert row["class"] == "induction"
    assert row["induction_share"] == pytest.approx(0.98, abs=0.01)
    kernel = model.blocks[0].attn.mta_kernel.detach()[3, 0]
    c_q, c_k = kernel.shape
    assert float(kernel[c_q - 1, (c_k - 1) // 2 - 1]) == pytest.approx(1.14, abs=0.01)


@torch.no_grad()
def test_switching_off_that_kernel_removes_the_copying(model):
    trained = _probe(model)
    assert trained["induction_score_softmax"] == pytest.approx(0.929, abs=0.002)
    assert trained["copy_loss_ratio"] == pytest.approx(0.259, abs=0.002)
    assert trained["text_copy_ratio"] == pytest.approx(0.250, abs=0.002)
    with plain_kernel(model, 0, 3):
        off = _probe(model)
    assert off["induction_score_softmax"] == pytest.approx(0.003, abs=0.002)
    assert off["copy_loss_ratio"] == pytest.approx(0.963, abs=0.002)
    assert off["text_copy_ratio"] == pytest.approx(0.944, abs=0.002)
    for head in (0, 1, 2):
        with plain_kernel(model, 0, head):
            assert 0.24 <= _probe(model)["copy_loss_ratio"] <= 0.28
    assert _probe(model) == trained          # every kernel restored


def test_plain_kernel_sets_one_head_to_the_identity_and_restores_it():
    model = tiny_model("mta", attn_cfg={"init_method": "uniform"})
    weight = model.blocks[1].attn.mta_kernel
    before = weight.detach().clone()
    with plain_kernel(model, 1, 2):
        k = weight.detach()
        assert torch.equal(k[[0, 1, 3]], before[[0, 1, 3]])
        c_q, c_k = k.shape[-2:]
        assert float(k[2].abs().sum()) == 1.0 and float(k[2, 0, c_q - 1, (c_k - 1) // 2]) == 1.0
    assert torch.equal(weight.detach(), before)
    with pytest.raises(ValueError, match="phase"):
        with plain_kernel(model, 0, 0, phase="middle"):
            pass
    with pytest.raises(ValueError, match="head 9"):
        with plain_kernel(model, 0, 9):
            pass
    with pytest.raises(ValueError, match="no pre-softmax"):
        with plain_kernel(tiny_model("mha"), 0, 0):
            pass
