"""Variant views (MTA kernels, CoPE counting and positions), stage-to-stage change, plots."""

from __future__ import annotations

import plotly.graph_objects as go
import pytest
import torch

from attnlens.hooked_models import available_variants
from attnlens.hooked_models.attention.mta.ops import init_kernel
from attnlens.interp import plots
from attnlens.interp.circuits import composed
from attnlens.interp.circuits import qk_ov as circuits
from attnlens.interp.tools import diversity, gating, heads, stage_change
from attnlens.interp.variants import cope, infini, mta

from helpers import EXACT, random_tokens, tiny_model

# -- MTA key-query kernels -------------------------------------------------------------------


def _kernel(c_q=3, c_k=5, taps=()):
    k = torch.zeros(c_q, c_k)
    for (a, b), v in taps:
        k[a, b] = v
    return k


@pytest.mark.parametrize("taps, expected", [
    ((((2, 2), 1.0),), "identity"),
    ((((2, 2), 1.0), ((1, 1), 0.9), ((0, 0), 0.8)), "diagonal"),
    ((((2, 2), 1.0), ((1, 2), 0.9), ((0, 2), 0.8)), "priming"),
    ((((2, 1), 1.0), ((1, 0), 0.4)), "induction"),            # current query, previous key
    ((((2, 1), 1.0),), "induction"),
    ((((2, 1), -1.0), ((1, 0), -0.4)), "mixed"),              # the same diagonal, negative
    ((((2, 2), 1.0), ((2, 3), -1.0)), "edge"),
    ((((2, 2), 1.0), ((0, 4), 0.9), ((1, 0), 0.7)), "mixed"),
])
def test_kernel_classes_on_constructed_kernels(taps, expected):
    assert mta.classify_kernel(_kernel(taps=taps), centre=2) == expected


def test_induction_share_is_the_previous_key_diagonal():
    """The diagonal ending at (current query, previous key): taps (2, 1), (1, 0) of a 3 x 5
    kernel centred on column 2; the identity diagonal (2, 2), (1, 1), (0, 0) is not counted."""
    k = _kernel(taps=(((2, 1), 3.0), ((1, 0), 1.0), ((2, 2), 1.0), ((1, 1), 1.0), ((0, 4), 1.0)))
    f = mta.kernel_features(k, centre=2)
    assert f["induction_share"] == pytest.approx(10.0 / 13.0)
    assert f["diagonal_share"] == pytest.approx(2.0 / 13.0)
    assert f["induction_sign"] == 1.0
    assert mta.kernel_features(-k, centre=2)["induction_sign"] == -1.0
    assert mta.kernel_features(_kernel(taps=(((2, 0), 1.0),)), centre=0)["induction_share"] == 0


def test_kernel_table_reads_the_model():
    model = tiny_model("mta", attn_cfg={"init_method": "diagonal", "query_kernel_size": 3,
                                        "key_kernel_size": 5})
    table = mta.kernel_table(model)
    assert len(table) == 2 * 2 * 4                                  # layers x phases x heads
    assert set(table[table.phase == "pre"]["class"]) == {"diagonal"}
    assert set(table[table.phase == "post"]["class"]) == {"identity"}  # always identity init
    with torch.no_grad():
        init_kernel(model.blocks[1].attn.mta_kernel, "identity")
    assert set(mta.kernel_table(model).query("layer == 1 and phase == 'pre'")["class"]) == {
        "identity"}
    assert len(mta.kernel_table(tiny_model("mha"))) == 0


# -- CoPE --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def open_cope():
    """CoPE with every gate open (q.k large via the biases): positions = relative positions."""
    model = tiny_model("cope", dtype="float64")
    with torch.no_grad():
        for b in model.blocks:
            b.attn.W_Q.zero_()
            b.attn.W_K.zero_()
            b.attn.b_Q.fill_(3.0)
            b.attn.b_K.fill_(3.0)
            b.attn.pos_emb.copy_(torch.randn(b.attn.pos_emb.shape,
                                             generator=torch.Generator().manual_seed(0)))
    return model


def test_cope_counts_every_token_when_gates_are_open(open_cope):
    tokens = random_tokens(open_cope, pos=10)
    units = cope.counted_units(open_cope, tokens)
    assert units["mean_gate"].min() > 0.99 and units["counted_share"].min() == 1.0
    assert units["last_position"].to_numpy() == pytest.approx(10.0, abs=0.1)
    assert units["relative_likeness"].min() > 0.99
    openers = cope.gate_openers(open_cope, tokens, top=3)
    assert len(openers) <= 2 * 4 * 3 and openers["mean_gate"].min() > 0.99


def test_cope_positional_attention_is_a_causal_softmax(open_cope):
    tokens = random_tokens(open_cope, pos=9)
    pos = cope.positional_attention(open_cope, tokens, layer=0)
    assert pos.shape == (2, 4, 9, 9)
    torch.testing.assert_close(pos.sum(-1), torch.ones(2, 4, 9, dtype=torch.float64), **EXACT)
    assert pos.triu(1).abs().max() == 0
    _, cache = open_cope.run_with_cache(tokens, names_filter="blocks.0.attn.hook_pos_logits")
    logits = cache["blocks.0.attn.hook_pos_logits"][0, 1, 5, :6]
    torch.testing.assert_close(pos[0, 1, 5, :6], torch.softmax(logits, -1), **EXACT)


def test_cope_views_refuse_models_without_positions():
    model = tiny_model("mha")
    with pytest.raises(ValueError, match="gates"):
        cope.counted_units(model, random_tokens(model, pos=6))


# -- stage-to-stage change -------------------------------------------------------------------


def test_js_divergence_known_values():
    p = torch.tensor([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]])
    zeros = torch.zeros(2, dtype=torch.float64)
    torch.testing.assert_close(stage_change.js_divergence(p, p), zeros, **EXACT)
    assert float(stage_change.js_divergence(torch.tensor([1.0, 0]), torch.tensor([0, 1.0]))) == 1


def test_identity_steps_do_not_move_maps_and_real_steps_do():
    model = tiny_model("mta")                       # identity kernels and mixings at init
    tokens = random_tokens(model, pos=10)
    same = stage_change.stage_change(model, tokens, "softmax", "pattern")
    assert same["js"].max() < 1e-9 and same["top1_agreement"].min() == 1.0
    with torch.no_grad():
        attn = model.blocks[1].attn
        attn.W_Q.mul_(50.0)                         # sharp, distinct heads ...
        attn.head_kernel.copy_(torch.eye(4).flip(0)[None])   # ... then swap them
    moved = stage_change.stage_change(model, tokens, "softmax", "pattern")
    assert moved.loc["L0H0", "js"] < 1e-9 and moved.loc["L1H0", "js"] > 1e-3


@pytest.mark.parametrize("variant", available_variants())
def test_views_and_changes_run_on_every_variant(variant):
    model = tiny_model(variant)
    tokens = random_tokens(model, pos=8)
    table = stage_change.catalogue_changes(model, tokens)
    n_maps = len([s for s in model.stages(0) if s.is_map])
    assert len(table) == 4 * 2 * (n_maps - 1)
    assert table["js"].between(0, 1 + 1e-9).all()
    to_pattern = stage_change.catalogue_changes(model, tokens, mode="to_pattern")
    assert set(to_pattern["target"]) == {"pattern"}
    # the variant-specific views either apply (by catalogue) or say clearly that they do not
    if cope.cope_layers(model):
        assert len(cope.counted_units(model, tokens)) == 4 * len(cope.cope_layers(model))
    if infini.memory_layers(model):
        assert len(infini.memory_specialisation(model, tokens)) == 8
    mta.kernel_table(model)


# -- plots -----------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", available_variants())
def test_every_figure_builds(variant, tmp_path):
    model = tiny_model(variant, attn_cfg={"segment_len": 4} if variant == "infini" else None)
    tokens = random_tokens(model, pos=10)
    figs = [plots.head_table_figure(heads.detect_heads(model, tokens), list(heads.DETECTORS)),
            plots.ablation_figure(heads.induction_ablation(model, [(0, 0)], batch=2,
                                                           half_len=4)),
            plots.composition_figure(circuits.composition_table(model, n_baseline=10)),
            plots.copying_figure(circuits.copying_scores(model)),
            plots.diversity_figure(diversity.head_diversity(model)),
            plots.gate_figure(gating.gate_values(model, tokens)),
            plots.stage_change_figure(stage_change.catalogue_changes(model, tokens))]
    for layer in range(2):
        for phase, M in composed.mixing_matrices(model, layer).items():
            if M is not None:
                figs.append(plots.mixing_figure(M, layer, phase))
    for (layer, phase), k in mta.key_query_kernels(model).items():
        figs.append(plots.kernel_figure(k, title=f"{layer} {phase}"))
    if cope.cope_layers(model):
        figs.append(plots.positional_attention_figure(
            cope.positional_attention(model, tokens, 0), head=1))
    if infini.memory_layers(model):
        figs.append(plots.memory_figure(infini.memory_specialisation(model, tokens)))
    assert all(isinstance(f, go.Figure) and (len(f.data) or f.layout.annotations) for f in figs)
    written = plots.save_figure(figs[0], tmp_path / "fig", png=False)
    assert written == [tmp_path / "fig.html"] and (tmp_path / "plotly.min.js").exists()
