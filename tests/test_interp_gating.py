"""Gating specialisation: catalogue-driven gate tables, Infini memory classes, borrowing."""

from __future__ import annotations

import pytest
import torch

from attnlens.hooked_models import available_variants
from attnlens.interp.circuits import composed
from attnlens.interp.tools import gating
from attnlens.interp.variants import infini

from helpers import random_tokens, tiny_model


@pytest.mark.parametrize("variant", available_variants())
def test_gate_table_runs_on_every_variant(variant):
    model = tiny_model(variant)
    tokens = random_tokens(model, pos=10)
    table = gating.gate_values(model, tokens)
    stages = {s.name for layer in range(2) for s in gating.head_scalar_stages(model, layer)}
    assert set(table["stage"]) == stages
    assert len(table) == 4 * sum(len(gating.head_scalar_stages(model, x)) for x in range(2))
    if len(table):
        assert (table["min"] <= table["mean"] + 1e-12).all()
        assert (table["mean"] <= table["max"] + 1e-12).all()
        assert table["class"].isin(["high", "low", "mixer", "intermediate", "excite",
                                    "inhibit", "neutral"]).all()


def test_gate_values_match_the_hooked_stage():
    model = tiny_model("mta", dtype="float64")
    tokens = random_tokens(model, pos=10)
    _, cache = model.run_with_cache(tokens, names_filter="blocks.1.attn.hook_gate")
    gate = cache["blocks.1.attn.hook_gate"]                      # [batch pos head]
    table = gating.gate_values(model, tokens)
    row = table[(table.layer == 1) & (table["head"] == 2)].iloc[0]
    assert row["mean"] == pytest.approx(float(gate[..., 2].mean()), rel=1e-10)
    assert not row["signed"] and 0 <= row["min"] <= row["max"] <= 1


def test_per_dimension_gate_counts_dimensions_as_samples():
    model = tiny_model("mta", attn_cfg={"gate_1d": False}, dtype="float64")
    tokens = random_tokens(model, pos=10)
    _, cache = model.run_with_cache(tokens, names_filter="blocks.0.attn.hook_gate")
    gate = cache["blocks.0.attn.hook_gate"]                      # [batch pos head d_head]
    assert gate.shape[-1] == model.cfg.d_head
    table = gating.gate_values(model, tokens)
    row = table[(table.layer == 0) & (table.stage == "gate") & (table["head"] == 1)].iloc[0]
    assert row["mean"] == pytest.approx(float(gate[:, :, 1].mean()), rel=1e-10)
    assert row["min"] == pytest.approx(float(gate[:, :, 1].min()), rel=1e-10)
    # a non-gate stage with a feature axis (hook_z) is still not a per-head scalar stage
    assert "z" not in {s.name for s in gating.head_scalar_stages(model, 0)}


def test_grouped_gates_fold_into_heads():
    model = tiny_model("dcmha", attn_cfg={"groups": 2}, dtype="float64")
    with torch.no_grad():
        model.blocks[0].attn.dd.mul_(100.0)
    tokens = random_tokens(model, pos=10)
    _, cache = model.run_with_cache(tokens, names_filter="blocks.0.attn.hook_post_qdd")
    dd = cache["blocks.0.attn.hook_post_qdd"]                    # [batch pos group head]
    table = gating.gate_values(model, tokens)
    row = table[(table.layer == 0) & (table.stage == "post_qdd") & (table["head"] == 3)]
    assert float(row["mean"].iloc[0]) == pytest.approx(float(dd[:, :, 1, 1].mean()), rel=1e-10)
    assert bool(row["signed"].iloc[0])


def test_classify_gate():
    assert [gating.classify_gate(v, signed=False) for v in (0.95, 0.05, 0.55, 0.7)] == [
        "high", "low", "mixer", "intermediate"]
    assert [gating.classify_gate(v, signed=True) for v in (0.5, -0.5, 0.0)] == [
        "excite", "inhibit", "neutral"]


def test_infini_memory_classes_and_ratio():
    model = tiny_model("infini", attn_cfg={"segment_len": 4}, dtype="float64")
    tokens = random_tokens(model, pos=12)
    values = torch.tensor([0.999, 0.001, 0.5, 0.7], dtype=torch.float64)
    infini.set_gates(model, values)
    table = infini.memory_specialisation(model, tokens)
    assert list(table.loc[[f"L0H{h}" for h in range(4)], "class"]) == [
        "memory specialist", "local specialist", "mixer", "intermediate"]
    torch.testing.assert_close(torch.tensor(table["gate"].to_numpy()[:4]), values, rtol=1e-10,
                               atol=0)
    assert (table["memory_tokens"] == 2 * 8).all()                # two segments after the first
    assert table.loc["L0H0", "memory_ratio"] == pytest.approx(1.0, abs=1e-2)
    assert table.loc["L0H1", "memory_ratio"] < 1e-2
    assert table.loc["L0H1", "local_ratio"] == pytest.approx(1.0, abs=1e-2)
    # the paper's classes come from the per-head gate stage of the catalogue too
    gates = gating.gate_values(model, tokens)
    assert list(gates[gates.layer == 0]["class"]) == ["high", "low", "mixer", "intermediate"]


def test_memory_views_refuse_models_without_memory():
    model = tiny_model("mha")
    with pytest.raises(ValueError, match="gate"):
        infini.memory_specialisation(model, random_tokens(model, pos=6))


def test_borrowing_from_static_mixing_equals_the_matrix():
    opts = dict(query_kernel_size=None, key_kernel_size=None, after_sm_query_kernel_size=None,
                after_sm_key_kernel_size=None)
    model = tiny_model("mta", attn_cfg=opts, dtype="float64")
    with torch.no_grad():
        model.blocks[0].attn.head_kernel.copy_(torch.randn(1, 4, 4,
                                                           generator=torch.Generator()))
    tokens = random_tokens(model, pos=6)
    table = composed.borrowing_table(model, tokens, 0, "post")
    M = model.blocks[0].attn.head_kernel[0].detach()
    row = table[(table.target == "L0H2") & (table.source == "L0H0")].iloc[0]
    assert row["mean_weight"] == pytest.approx(float(M[0, 2]), rel=1e-10)
    assert len(composed.borrowing_table(tiny_model("mha"), tokens, 0)) == 0
