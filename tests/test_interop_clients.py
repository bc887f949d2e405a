"""Module-hooking clients see every stage of every variant (issue 21): plain torch
`register_forward_hook`, nnsight and pyvene read each stage hook point alone (so a layer on its
fast path must notice them and materialise its maps) and edit it with the same effect as a
TransformerLens hook; CircuitsVis renders every variant with the colour range it needs.
docs/ecosystem.md's examples run in tests/test_docs.py."""

from __future__ import annotations

import circuitsvis as cv
import pytest
import pyvene as pv
import torch
from nnsight import NNsight

from attnlens.hooked_models import available_variants
from attnlens.interp.tools.ecosystem import circuitsvis_args, row_stochastic_stage

from helpers import EXACT, random_tokens, tiny_model

VARIANTS = available_variants()
SMALL = {"infini": {"segment_len": 4}}


def perturbed(attention: str, **overrides):
    model = tiny_model(attention, dtype=torch.float64, attn_cfg=SMALL.get(attention),
                       tokenizer_alphabet="abcdefgh", **overrides)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return model.eval()


def stage_names(model) -> list[tuple[int, str]]:
    return [(layer, stage.name) for layer in range(model.cfg.n_layers)
            for stage in model.stages(layer)]


def editable_maps(model, layer: int) -> list[str]:
    """Map stages whose edits the layer reads (Infini's memory records are read-only)."""
    return [s.name for s in model.stages(layer)
            if s.is_map and "read-only" not in s.description]


@pytest.fixture(scope="module", params=VARIANTS)
def case(request):
    model = perturbed(request.param)
    tokens = random_tokens(model, batch=2, pos=10)
    _, cache = model.run_with_cache(tokens)
    return model, tokens, cache


def test_plain_forward_hook_sees_each_stage_alone(case):
    model, tokens, cache = case
    for layer, stage in stage_names(model):
        name = f"blocks.{layer}.attn.hook_{stage}"
        got: list = []
        handle = model.hook_dict[name].register_forward_hook(
            lambda m, i, o, got=got: got.append(o))
        try:
            model(tokens)
        finally:
            handle.remove()
        assert got, f"{name} did not fire for a plain torch forward hook"
        torch.testing.assert_close(got[0], cache[name], **EXACT)


def test_nnsight_reads_each_stage_alone(case):
    model, tokens, cache = case
    traced = NNsight(model)
    for layer, stage in stage_names(model):
        name = f"blocks.{layer}.attn.hook_{stage}"
        with traced.trace(tokens):
            saved = getattr(traced.blocks[layer].attn, f"hook_{stage}").output.save()
        torch.testing.assert_close(saved, cache[name], **EXACT, msg=lambda m, n=name: f"{n}: {m}")
    with traced.trace(tokens):   # several stages of one layer, in the order they run
        first = traced.blocks[1].attn.hook_attn_scores.output.save()
        last = traced.blocks[1].attn.hook_pattern.output.save()
    torch.testing.assert_close(first, cache["attn_scores", 1], **EXACT)
    torch.testing.assert_close(last, cache["pattern", 1], **EXACT)


def test_the_catalogue_lists_a_layers_stages_in_the_order_their_hooks_fire(case):
    """Clients that follow the forward (nnsight) must ask for stages in execution order; the
    catalogue is that order. DCMHA listed its maps before the dynamic weights they are computed
    from, so reading its stages in catalogue order failed at hook_pre_qw1 (issue 48)."""
    model, tokens, _ = case
    for layer in range(model.cfg.n_layers):
        stages = [s.name for s in model.stages(layer)]
        fired: list[str] = []
        handles = [model.hook_dict[f"blocks.{layer}.attn.hook_{s}"].register_forward_hook(
            lambda m, i, o, s=s, fired=fired: fired.append(s)) for s in stages]
        try:
            model(tokens)
        finally:
            for handle in handles:
                handle.remove()
        assert fired == stages, f"layer {layer}: hooks fire {fired}, catalogue {stages}"


def test_nnsight_reads_every_stage_of_a_layer_in_one_trace(case):
    model, tokens, cache = case
    traced = NNsight(model)
    for layer in range(model.cfg.n_layers):
        names = [s.name for s in model.stages(layer)]
        saved = []
        with traced.trace(tokens):   # nnsight runs the block's own lines: a loop, not a list
            for name in names:       # comprehension (a scope of its own)
                saved.append(getattr(traced.blocks[layer].attn, f"hook_{name}").output.save())
        for name, value in zip(names, saved, strict=True):
            torch.testing.assert_close(value, cache[f"blocks.{layer}.attn.hook_{name}"], **EXACT,
                                       equal_nan=True,
                                       msg=lambda m, n=name, la=layer: f"L{la} {n}: {m}")


def test_nnsight_edits_like_a_transformer_lens_hook(case):
    model, tokens, _ = case
    traced = NNsight(model)
    for layer in range(model.cfg.n_layers):
        for stage in editable_maps(model, layer):
            name = f"blocks.{layer}.attn.hook_{stage}"
            with traced.trace(tokens):
                point = getattr(traced.blocks[layer].attn, f"hook_{stage}")
                point.output = point.output * 0.5
                logits = traced.output.save()
            expected = model.run_with_hooks(tokens, fwd_hooks=[(name, lambda x, hook: x * 0.5)])
            torch.testing.assert_close(logits, expected, **EXACT,
                                       msg=lambda m, n=name: f"{n}: {m}")


def test_pyvene_collects_and_edits_each_stage(case):
    model, tokens, cache = case
    assert model.config is model.cfg and model.device == torch.device("cpu")
    for layer, stage in stage_names(model):
        name = f"blocks.{layer}.attn.hook_{stage}"
        # keep_last_dim: collect the tensor as it is (pyvene flattens only up to 4 axes; DCMHA's
        # dynamic weights and Infini's memory have 5)
        collect = pv.IntervenableModel({"component": f"{name}.output", "intervention":
                                        pv.CollectIntervention(keep_last_dim=True)}, model=model)
        (_, collected), _ = collect(base={"input": tokens}, unit_locations=None)
        torch.testing.assert_close(collected[0], cache[name], **EXACT)
    for layer in range(model.cfg.n_layers):
        name = f"blocks.{layer}.attn.hook_pattern"
        zero = pv.IntervenableModel({"component": f"{name}.output",
                                     "intervention": pv.ZeroIntervention()}, model=model)
        _, logits = zero(base={"input": tokens}, unit_locations=None)
        expected = model.run_with_hooks(tokens, fwd_hooks=[(name, lambda x, hook: x * 0)])
        torch.testing.assert_close(logits, expected, **EXACT)


@pytest.mark.parametrize("attention", VARIANTS)
def test_circuitsvis_renders_with_a_signed_range_where_needed(attention):
    model = perturbed(attention)
    text = "abcabcab"
    for layer in range(model.cfg.n_layers):
        args = circuitsvis_args(model, text, layer, "pattern")
        signed = bool((args["attention"] < 0).any())
        row_stochastic = next(s for s in model.stages(layer) if s.name == "pattern").row_stochastic
        assert (args["min_value"], args["max_value"]) == (0.0, 1.0) if row_stochastic else \
            args["min_value"] == -args["max_value"] < 0
        assert not signed or not row_stochastic
        assert args["attention"].shape == (model.cfg.n_heads, 9, 9) and len(args["tokens"]) == 9
        html = str(cv.attention.attention_heads(**args))
        assert "<script" in html or "<div" in html
        stage = row_stochastic_stage(model, layer)
        chosen = circuitsvis_args(model, text, layer, stage)
        assert (chosen["min_value"], chosen["max_value"]) == (0.0, 1.0)
        assert str(cv.attention.attention_patterns(attention=chosen["attention"],
                                                   tokens=chosen["tokens"]))

