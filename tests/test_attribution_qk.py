"""The QK side of attribution graphs (attnlens.interp.attribution.qk) on every variant, in float64:
the score splits exactly over sources through the query and through the key, each share equals an
exact ablation of that source on that side only, the pair terms are the mixed ablation
differences, and post-softmax mixing (MTA, DCMHA) and CoPE's positions split exactly."""

import pytest
import torch
from attribution_models import CASES, model_and_transcoders, prompt

from attnlens.interp.attribution.qk import (
    attribute_qk,
    cope_position_counts,
    pattern_sources,
    qk_pairs,
    qk_score,
    score_stage,
)
from attnlens.interp.attribution.replacement import alphas_like, clean_run

QUERY, KEY = 10, 7
INFINI_KEY = 9      # Infini's local scores live within a segment (4 tokens: 8 .. 11)


def _ablated(run, n_sources_features, index):
    """Scales with source `index` (graph order) at 0, the rest 1 (no grad)."""
    a = alphas_like(run, 1, 1.0, False)
    if index < n_sources_features:
        for layer in sorted(a.features):
            n = a.features[layer].shape[1]
            if index < n:
                a.features[layer][0, index] = 0.0
                return a
            index -= n
    index -= n_sources_features
    n_err = a.errors[0].numel()
    if index < n_err:
        a.errors[0].view(-1)[index] = 0.0
    else:
        a.embed[0, index - n_err] = 0.0
    return a


@pytest.fixture(scope="module", params=list(CASES))
def qk_case(request):
    model, tcs = model_and_transcoders(request.param)
    run = clean_run(model, tcs, prompt(model))
    key = INFINI_KEY if request.param.startswith("infini") else KEY
    qk = attribute_qk(model, tcs, None, layer=1, head=1, query_pos=QUERY, key_pos=key, run=run)
    return request.param, model, tcs, run, qk


def test_score_is_the_clean_score_and_each_side_sums_to_it(qk_case):
    case, model, tcs, run, qk = qk_case
    _, cache = model.run_with_cache(run.tokens)
    assert qk.stage == score_stage(model, 1)
    assert abs(qk.score - float(cache[qk.stage][0, 1, QUERY, qk.key_pos])) < 1e-12
    assert abs(float(qk.query_side.sum()) + qk.query_bias - qk.score) < 1e-11
    assert abs(float(qk.key_side.sum()) + qk.key_bias - qk.score) < 1e-11
    # sources after a side's position cannot reach it; MTA's key-query convolution (centred
    # key kernel, pad_key "both") also reads the keys just after KEY, never past the query
    n_f = qk.features.shape[0]
    reach = QUERY if case == "mta" else qk.key_pos
    later_q = (qk.features[:, 1] > QUERY).nonzero().flatten()
    later_k = (qk.features[:, 1] > reach).nonzero().flatten()
    assert not qk.query_side[later_q].any() and not qk.key_side[later_k].any()
    key_embeds = qk.key_side[-run.n_pos:]
    assert not key_embeds[reach + 1:].any()
    if case == "mta":
        assert key_embeds[qk.key_pos + 1:QUERY + 1].any()
    assert len(qk.labels) == len(qk.query_side) == n_f + run.n_pos * (model.cfg.n_layers + 1)


def test_each_share_is_an_exact_ablation_on_its_side(qk_case):
    case, model, tcs, run, qk = qk_case
    n_f = qk.features.shape[0]
    ones = alphas_like(run, 1, 1.0, False)
    for side in ("query", "key"):
        values = qk.query_side if side == "query" else qk.key_side
        for index in values.abs().argsort(descending=True)[:3].tolist():
            ablated = _ablated(run, n_f, index)
            with torch.no_grad():
                score = qk_score(model, run, ablated if side == "query" else ones,
                                 ones if side == "query" else ablated, 1, 1, QUERY, qk.key_pos)
            assert abs((qk.score - float(score)) - float(values[index])) < 1e-11, (case, side)


def test_pair_terms_are_mixed_ablation_differences(qk_case):
    case, model, tcs, run, qk = qk_case
    n_f = qk.features.shape[0]
    qs = qk.query_side.abs().argsort(descending=True)[:2].tolist()
    ks = qk.key_side.abs().argsort(descending=True)[:2].tolist()
    pairs = qk_pairs(model, run, 1, 1, QUERY, qk.key_pos, qs, ks)
    ones = alphas_like(run, 1, 1.0, False)
    for i, s in enumerate(qs):
        for j, t in enumerate(ks):
            with torch.no_grad():
                f = {(a, b): float(qk_score(model, run, _ablated(run, n_f, s) if a else ones,
                                            _ablated(run, n_f, t) if b else ones,
                                            1, 1, QUERY, qk.key_pos))
                     for a in (0, 1) for b in (0, 1)}
            mixed = f[0, 0] - f[1, 0] - f[0, 1] + f[1, 1]
            assert abs(mixed - float(pairs[i, j])) < 1e-11, (case, s, t)


def test_bad_requests_are_named():
    model, tcs = model_and_transcoders("mha-rotary")
    with pytest.raises(ValueError, match="key_pos 5 is after query_pos 3"):
        attribute_qk(model, tcs, prompt(model), 1, 0, query_pos=3, key_pos=5)
    with pytest.raises(ValueError, match=r"head=9 is out of range \(0 .. 3\)"):
        attribute_qk(model, tcs, prompt(model), 1, 9, query_pos=3, key_pos=1)
    model, tcs = model_and_transcoders("infini-linear")
    with pytest.raises(ValueError, match="is -inf: that key is masked .*compressive memory"):
        attribute_qk(model, tcs, prompt(model), 1, 0, query_pos=QUERY, key_pos=KEY)


@pytest.mark.parametrize("phase", ["pre", "post"])
@pytest.mark.parametrize("case", ["mta", "dcmha"])
def test_mixed_maps_split_over_the_entries_they_mix(case, phase):
    """post: the effective pattern over the softmax entries; pre: the final pre-softmax score
    over the raw q . k scores (MTA's convolution and mixing, DCMHA's Compose)."""
    model, _ = model_and_transcoders(case)
    split = pattern_sources(model, prompt(model), 1, 2, QUERY, KEY, phase=phase)
    _, cache = model.run_with_cache(prompt(model))
    stage = "blocks.1.attn.hook_pattern" if phase == "post" else score_stage(model, 1)
    value = float(cache[stage][0, 2, QUERY, KEY])
    assert abs(split.value - value) < 1e-13
    assert abs(float(split.contributions.sum()) - value) < 1e-12
    heads = set(split.entries[:, 0].tolist())
    assert len(heads) > 1          # other heads' maps are mixed in
    with pytest.raises(ValueError, match="does not mix its softmax maps"):
        pattern_sources(model_and_transcoders("cope")[0], prompt(model), 1, 0, 3, 1)
    with pytest.raises(ValueError, match="phase must be"):
        pattern_sources(model, prompt(model), 1, 0, 3, 1, phase="mid")


def test_cope_positions_split_over_the_tokens_counted():
    model, _ = model_and_transcoders("cope")
    counts = cope_position_counts(model, prompt(model), 1, 0, QUERY, KEY)
    assert counts.tokens == list(range(KEY, QUERY + 1))
    assert not counts.clamped
    assert abs(float(counts.gates.sum()) - counts.position) < 1e-12
    assert ((counts.gates > 0) & (counts.gates < 1)).all()


@pytest.mark.parametrize("case", list(CASES))
def test_split_separates_constants_positions_and_sources(case):
    """The split's terms sum to the score; the constant terms agree with the biases of
    attribute_qk (computed by other forwards); each source list sums to the source x source
    term; only sources that can reach the head are listed (a layer-0 head: embeddings)."""
    from attnlens.interp.attribution.qk import qk_split
    from attnlens.interp.plots.attribution_graph import qk_split_figure

    model, tcs = model_and_transcoders(case)
    run = clean_run(model, tcs, prompt(model))
    key = INFINI_KEY if case.startswith("infini") else KEY
    split = qk_split(model, tcs, None, 1, 1, QUERY, key, run=run)
    qk = attribute_qk(model, tcs, None, layer=1, head=1, query_pos=QUERY, key_pos=key, run=run)
    terms = dict(split.terms)
    assert split.score == pytest.approx(qk.score, abs=1e-12)
    assert sum(terms.values()) == pytest.approx(split.score, abs=1e-12)
    positional = terms.get("position logit, constant q", 0.0) + \
        terms.get("position logit, q of sources", 0.0)
    assert ("position logit, q of sources" in terms) == (case == "cope")
    if case == "cope":
        assert abs(terms["position logit, q of sources"]) > 1e-3
    assert terms["constant q · constant k"] + terms["q of sources · constant k"] + positional \
        == pytest.approx(qk.key_bias, abs=1e-12)
    assert terms["constant q · constant k"] + terms.get("position logit, constant q", 0.0) + \
        terms["constant q · k of sources"] == pytest.approx(qk.query_bias, abs=1e-12)
    both = terms["q of sources · k of sources"]
    for side in (split.query, split.key):
        assert sum(v for _, v in side) == pytest.approx(both, abs=1e-12)
        assert all(v != 0 for _, v in side)
        assert not any(label.startswith("L1 ") for label, _ in side)   # layer 1 is not before
    layer0 = qk_split(model, tcs, None, 0, 1, QUERY, key, run=run)
    assert {label.split()[0] for label, _ in layer0.query + layer0.key} == {"embed"}
    fig = qk_split_figure(split)
    assert len(fig.data) == 3 and "through the query" in {t.name for t in fig.data}
