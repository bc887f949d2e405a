"""The Outputs, Induction heads and Circuits pages: their interp functions against independent
float64 computations, and their callbacks through Dash's HTTP endpoint (as the browser, or a
crafted request, calls them) with every kind of bad value."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
import torch
from dashboard_common import ALPHABET, call

from attnlens.dashboards.app import _parse_link, create_app, make_link
from attnlens.dashboards.store import MAX_PROMPT_CHARS, ModelStore
from attnlens.interp.circuits.composed import composed_ov, composed_qk, mixing_at
from attnlens.interp.circuits.qk_ov import composition_table
from attnlens.interp.circuits.tokens import circuit_token_ids, has_head_mixing, token_circuit
from attnlens.interp.plots.circuits import composition_vs_baseline_figure, token_circuit_figure
from attnlens.interp.tools.induction_study import (
    ablation_effect,
    make_probe,
    probe_loss,
    probe_scores,
    training_curve,
)
from attnlens.interp.tools.outputs import next_token_losses, repeat_losses, top_predictions

from helpers import tiny_model

EXACT = dict(atol=1e-10, rtol=0)


def _model(variant, **kw):
    return tiny_model(variant, tokenizer_alphabet=ALPHABET, n_ctx=48, dtype="float64", **kw)


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory):
    """A run directory with the metrics log `trainer.fit` writes (evaluations every 2 steps)."""
    d = tmp_path_factory.mktemp("run")
    records = [{"step": s, "tokens": 64 * s, "train_loss": 3.0 - 0.1 * s}
               | ({"induction_score": 0.1 * s, "repeat_loss": 3.0 - 0.2 * s} if s % 2 == 0
                  else {}) for s in range(1, 9)]
    (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return d


@pytest.fixture(scope="module")
def store(log_dir):
    store = ModelStore()
    store.add("tiny-mha", _model("mha"), "the cat. the cat.", directory=log_dir)
    store.add("tiny-dcmha", _model("dcmha", attn_cfg={"static_proj": True}), "the cat. the cat.")
    store.add("tiny-mta", _model("mta"), "abc abc")
    store.add("one-layer", _model("mha", n_layers=1), "ab ab")
    return store


@pytest.fixture(scope="module")
def app(store):
    return create_app(store)


def values(page, models=("tiny-mha",), prompt="", layer=0, head=0, stage="pattern", **own):
    out = {"tabs.value": page, "ctl-models.value": list(models), "ctl-applied-prompt.data": prompt,
           "ctl-layer.value": layer, "ctl-head.value": head, "ctl-stage.value": stage,
           "outputs-k.value": 3, "outputs-start.value": 0, "heads-probe.value": "random",
           "heads-half.value": 6, "heads-ablate-at.value": "z", "heads-ablate-how.value": "zero",
           "heads-ablate-score.value": "induction", "heads-ablate-head.value": "auto",
           "circuits-kind.value": "plain",
           "circuits-query.value": 1, "circuits-key.value": 0}
    out.update({k.replace("_", "-").replace("--", "-") + ".value": v for k, v in own.items()})
    return out


def array(value) -> np.ndarray:
    """A plotly array from JSON: a list, or plotly's typed binary {"dtype", "bdata", "shape"}."""
    if isinstance(value, dict):
        flat = np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"])
        shape = value.get("shape")
        return flat.reshape([int(n) for n in str(shape).split(",")]) if shape else flat
    return np.asarray(value, dtype=float)


def response(app, prefix, vals):
    status, resp = call(app, prefix, vals)
    assert status == 200, status
    return resp["response"]


# -- interp: outputs -------------------------------------------------------------------------

def test_next_token_losses_and_top_predictions_are_the_softmax(store):
    model = store.get("tiny-mha")
    tokens = model.to_tokens("the cat sat")
    logits = model(tokens).double()
    want = torch.nn.functional.cross_entropy(logits[0, :-1], tokens[0, 1:], reduction="none")
    torch.testing.assert_close(next_token_losses(model, tokens)[0], want, **EXACT)
    top = top_predictions(model, tokens, k=4)
    probs = torch.softmax(logits[0], -1)
    for pos in (0, 5, tokens.shape[1] - 1):
        rows = top[top["position"] == pos].sort_values("rank")
        ids = probs[pos].argsort(descending=True)[:4].tolist()
        assert rows["prediction_id"].tolist() == ids
        torch.testing.assert_close(torch.tensor(rows["prob"].tolist(), dtype=torch.float64),
                                   probs[pos, ids], **EXACT)
        nxt = int(tokens[0, pos + 1]) if pos + 1 < tokens.shape[1] else None
        assert rows["correct"].tolist() == [i == nxt for i in ids]
    with pytest.raises(ValueError, match="k=0 must be an integer >= 1"):
        top_predictions(model, tokens, k=0)
    with pytest.raises(ValueError, match="k=21 is over the limit"):
        top_predictions(model, tokens, k=21)
    with pytest.raises(ValueError, match="at least 2"):
        next_token_losses(model, tokens[:, :1])


def test_repeat_losses_compare_the_same_token_in_both_copies(store):
    model = store.get("tiny-mha")
    tokens = model.to_tokens("abcde")                          # BOS a b c d e
    r = repeat_losses(model, tokens)
    seq = torch.cat([tokens, tokens[:, 1:]], dim=1)            # BOS abcde abcde
    per = next_token_losses(model, seq)[0]
    assert r.n_tokens == r.cut_from == 5 and r.table["token"].tolist() == list("bcde")
    # token j of the text sits at 1 + j (first copy) and 1 + 5 + j (second copy)
    for row in r.table.itertuples():
        assert abs(row.first - float(per[row.offset])) < 1e-10
        assert abs(row.second - float(per[5 + row.offset])) < 1e-10
        assert abs(row.drop - (row.first - row.second)) < 1e-12
    long = repeat_losses(model, model.to_tokens("abcdefghijklmnopqrstuvwxyz abcdefghij"))
    assert (long.n_tokens, long.cut_from) == (23, 37)          # 1 + 2 * 23 <= n_ctx = 48
    with pytest.raises(ValueError, match="at least 2 tokens twice"):
        repeat_losses(model, model.to_tokens("a"))


# -- interp: induction study -------------------------------------------------------------------

def test_probes_scores_loss_and_ablation(store):
    model = store.get("tiny-mha")
    probe = make_probe(model, "random", half_len=6, batch=4, seed=3)
    assert probe.tokens.shape == (4, 13)
    assert torch.equal(probe.tokens[:, 1:7], probe.tokens[:, 7:])
    losses = next_token_losses(model, probe.tokens)        # the second copy, after its first
    assert abs(probe_loss(model, probe) - float(losses[:, 7:].mean())) < 1e-12
    table = probe_scores(model, probe)
    assert {"previous_token", "duplicate_token", "induction", "induction_stripe"} <= set(table)
    # knocking L0H2's pattern out makes its own pattern zero: every score of it is 0 after
    scores, loss = ablation_effect(model, probe, [(0, 2)], hook="pattern")
    own = scores[scores["head_label"] == "L0H2"]
    assert (own["after"].abs() < 1e-12).all() and (own["before"] > 0).any()
    assert abs(loss["before"] - probe_loss(model, probe)) < 1e-12
    assert loss["after"] != loss["before"] and loss["delta"] == loss["after"] - loss["before"]
    text = make_probe(model, "text", tokens=model.to_tokens("abab"))
    assert "induction_stripe" not in probe_scores(model, text)
    for kw, msg in [({"kind": "zz"}, "probe 'zz'"), ({"half_len": 24}, "choose 2 .. 23"),
                    ({"half_len": 1}, "half_len=1 must be"), ({"kind": "text"}, "needs tokens")]:
        with pytest.raises(ValueError, match=msg):
            make_probe(model, **kw)
    with pytest.raises(ValueError, match="at least one"):
        ablation_effect(model, probe, [])


def test_training_curve_reads_the_evaluations(log_dir, tmp_path):
    curve = training_curve(log_dir)
    assert curve["step"].tolist() == [2, 4, 6, 8]
    assert curve["induction_score"].tolist() == pytest.approx([0.2, 0.4, 0.6, 0.8])
    with pytest.raises(ValueError, match="has no training log"):
        training_curve(tmp_path)
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "train_loss": 2}\n{oops\n')
    with pytest.raises(ValueError, match="line 2 is not JSON"):
        training_curve(tmp_path)
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "train_loss": 2}\n')
    with pytest.raises(ValueError, match="no evaluation with 'induction_score'"):
        training_curve(tmp_path)


# -- interp: circuits over tokens ---------------------------------------------------------------

def test_token_circuits_equal_the_dense_full_circuits(store):
    model = store.get("tiny-mha")
    ids = circuit_token_ids(model, model.to_tokens("the cat"))
    assert ids == model.to_tokens("the cat")[0, 1:].unique_consecutive().tolist()[:len(ids)]
    assert len(ids) == len(set("the cat"))
    W_E, W_U = model.W_E.detach(), model.W_U.detach()
    attn = model.blocks[1].attn
    qk = W_E[ids] @ attn.W_Q[2].detach() @ attn.W_K[2].detach().T @ W_E[ids].T
    ov = W_E[ids] @ attn.W_V[2].detach() @ attn.W_O[2].detach() @ W_U[:, ids]
    torch.testing.assert_close(token_circuit(model, 1, 2, ids, "qk"), qk, **EXACT)
    torch.testing.assert_close(token_circuit(model, 1, 2, ids, "ov"), ov, **EXACT)
    torch.testing.assert_close(token_circuit(model, 1, 2, ids, "qk", composed=True), qk, **EXACT)
    assert not has_head_mixing(model)
    with pytest.raises(ValueError, match="kind='xy'"):
        token_circuit(model, 1, 2, ids, "xy")
    with pytest.raises(ValueError, match="head 4 is outside"):
        token_circuit(model, 1, 4, ids)
    with pytest.raises(ValueError, match="at most 3"):
        circuit_token_ids(model, model.to_tokens("abcd"), limit=3)


def test_composed_token_circuits_follow_the_head_mixing(store):
    model = store.get("tiny-dcmha")
    assert has_head_mixing(model)
    ids = circuit_token_ids(model, model.to_tokens("cat"))
    W_E = model.W_E.detach()[ids]
    want = W_E @ composed_qk(model, 0)[1].AB.detach() @ W_E.T
    got = token_circuit(model, 0, 1, ids, "qk", composed=True)
    torch.testing.assert_close(got, want, **EXACT)
    assert not torch.allclose(got, token_circuit(model, 0, 1, ids, "qk"))
    ov = W_E @ composed_ov(model, 0)[1].AB.detach() @ model.W_U.detach()[:, ids]
    torch.testing.assert_close(token_circuit(model, 0, 1, ids, "ov", composed=True), ov, **EXACT)


def test_token_circuits_at_a_pair_follow_the_dynamic_mixing(store):
    model = store.get("tiny-dcmha")
    tokens = model.to_tokens("the cat")
    ids = circuit_token_ids(model, tokens)
    mix = mixing_at(model, tokens, 1, 5, 2)
    attn = model.blocks[1].attn
    W_Q, W_K, W_V, W_O = (w.detach() for w in (attn.W_Q, attn.W_K, attn.W_V, attn.W_O))
    qk = sum(mix["pre"][0, n, 3] * W_Q[n] @ W_K[n].T for n in range(4))    # into head 3
    ov = sum(mix["post"][0, 3, m] * W_V[m] @ W_O[m] for m in range(4))     # head 3's weights
    W_E, W_U = model.W_E.detach()[ids], model.W_U.detach()[:, ids]
    got = token_circuit(model, 1, 3, ids, "qk", composed=True, at=(tokens, 5, 2))
    torch.testing.assert_close(got, W_E @ qk @ W_E.T, **EXACT)
    got = token_circuit(model, 1, 3, ids, "ov", composed=True, at=(tokens, 5, 2))
    torch.testing.assert_close(got, W_E @ ov @ W_U, **EXACT)
    other = token_circuit(model, 1, 3, ids, "qk", composed=True, at=(tokens, 6, 0))
    assert not torch.allclose(other, W_E @ qk @ W_E.T)     # the mixing depends on the pair
    with pytest.raises(ValueError, match="causal pair"):
        token_circuit(model, 1, 3, ids, "qk", at=(tokens, 2, 5))


def test_circuit_figures_are_honest(store):
    fig = token_circuit_figure(torch.tensor([[1.0, -3.0], [0.5, 2.0]]), ["a", "b"], "ov")
    h = fig.data[0]
    assert (h.zmin, h.zmax, h.zmid, h.colorscale[0][1]) == (-3.0, 3.0, 0.0, "#053061")
    assert h.colorbar.title.text == "logit change"
    assert fig.layout.xaxis.title.text == "output logit of token"
    assert fig.layout.yaxis.title.text == "source token (attended to)"
    table = composition_table(store.get("tiny-mha"), modes=["K", "V"], n_baseline=50)
    fig = composition_vs_baseline_figure(table)
    k = table[table["mode"] == "K"].pivot_table(index="source", columns="dest", values="score")
    assert fig.data[0].z[0][0] == pytest.approx(k.iloc[0, 0] - table["baseline"].iloc[0])
    axis = fig.layout.coloraxis
    assert axis.cmid == 0 and axis.cmin == -axis.cmax and axis.colorbar.title.text
    with pytest.raises(ValueError, match="need 3 x 3"):
        token_circuit_figure(torch.zeros(2, 2), ["a", "b", "c"], "qk")


# -- pages: nothing for a hidden tab, deep links -----------------------------------------------

@pytest.mark.parametrize("prefix", ["outputs-loss", "heads-scores", "heads-ablation",
                                    "heads-composition", "circuits-qk", "circuits-copying"])
def test_hidden_tabs_compute_nothing(app, prefix):
    status, _ = call(app, prefix, values("compare"))
    assert status == 204      # every output no_update: Dash answers "no content"


@pytest.mark.parametrize("page", ["outputs", "heads", "circuits"])
def test_deep_links_open_the_pages(app, page):
    link = make_link(page, ["tiny-dcmha"], 1, 3, "probs", "abc")
    vals = {"url.search": link, "tabs.value": "compare", "ctl-models.value": ["tiny-mha"],
            "ctl-applied-prompt.data": "", "ctl-layer.value": 0, "ctl-head.value": 0,
            "ctl-stage.value": "pattern"}
    _, resp = call(app, "url.search", vals, changed="url.search")
    out = resp["response"]
    assert out["tabs"]["value"] == page and out["ctl-models"]["value"] == ["tiny-dcmha"]
    assert (out["ctl-layer"]["value"], out["ctl-head"]["value"]) == (1, 3)
    assert _parse_link(link)["page"] == page


# -- Outputs page ------------------------------------------------------------------------------

def test_outputs_page_shows_every_model(app, store):
    out = response(app, "outputs-loss", values("outputs", ["tiny-mha", "tiny-mta"], "abcab",
                                               outputs__k=4))
    lines = out["outputs-loss"]["figure"]["data"]
    assert [t["name"] for t in lines] == ["tiny-mha", "tiny-mta"]
    model = store.get("tiny-mta")
    want = next_token_losses(model, model.to_tokens("abcab"))[0]
    np.testing.assert_allclose(array(lines[1]["y"]), want.numpy(), rtol=0, atol=1e-12)
    tables = out["outputs-topk"]["children"]
    assert len(tables) == 2
    heat = tables[0]["props"]["figure"]["data"][0]
    assert heat["zmin"] == 0 and heat["zmax"] == 1 and len(heat["x"]) == 4
    assert heat["colorbar"]["title"]["text"] == "probability"
    repeat = out["outputs-repeat"]["figure"]["data"]
    assert len(repeat) == 4 and "mean drop" in repeat[1]["name"]
    assert out["outputs-error"]["children"] == ""


@pytest.mark.parametrize("change, message", [
    ({"ctl-models.value": ["nope"]}, "unknown model 'nope'"),
    ({"ctl-models.value": []}, "choose 1 to 5 models"),
    ({"ctl-models.value": "tiny-mha"}, ""),                       # one name as a string is fine
    ({"outputs-k.value": 0}, "k 0 is not a valid k"),
    ({"outputs-k.value": 99}, "k 99 is not a valid k"),
    ({"outputs-k.value": "3; drop"}, "k '3; drop' is not a valid k"),
    ({"outputs-start.value": 500}, "table start position 500"),
    ({"outputs-start.value": 1.5}, "table start position 1.5"),
    ({"ctl-applied-prompt.data": "x" * 60}, "reads at most 48"),
    ({"ctl-applied-prompt.data": "ABC"}, "character 'A' is not in the tokenizer alphabet"),
    ({"ctl-applied-prompt.data": "a" * (MAX_PROMPT_CHARS + 1)}, "the dashboard accepts at most"),
])
def test_outputs_page_bad_values(app, change, message):
    vals = values("outputs")
    vals.update(change)
    out = response(app, "outputs-loss", vals)
    assert message in out["outputs-error"]["children"]
    if message:
        assert out["outputs-loss"]["figure"] == {}


def test_outputs_page_notes(app):
    out = response(app, "outputs-loss", values("outputs", ["tiny-mha", "tiny-mta"],
                                               "abcdefghijklmnopqrstuvwxyz abcdefghij"))
    note = out["outputs-note"]["children"]
    assert "cut to its first 23 of 37 tokens" in note
    out = response(app, "outputs-loss", values("outputs"))
    assert "the prompt is empty: showing the default text" in out["outputs-note"]["children"]


# -- Induction heads page ----------------------------------------------------------------------

def test_induction_scores_of_a_composed_pattern_say_they_are_not_attention_mass(app):
    """Issue 56 item 6: DCMHA's `pattern` after Compose is a signed mix of heads (text-dcmha-l4mlp
    L3H0 scores 2.72, rows summing to 3.4 on average): the page says what such a score is, and
    names the row-stochastic stage; a plain softmax pattern needs no such note."""
    note = response(app, "heads-scores", values("heads", ["tiny-dcmha", "tiny-mha"]))[
        "heads-note"]["children"]
    assert "tiny-dcmha: hook_pattern is not an attention distribution" in note
    assert "not attention mass" in note and "hook_probs is the row-stochastic stage" in note
    assert "tiny-mha: hook_pattern" not in note


def test_induction_page_scores_every_model(app, store):
    out = response(app, "heads-scores", values("heads", ["tiny-mha", "tiny-dcmha"]))
    figures = out["heads-scores"]["children"]
    assert len(figures) == 2
    fig = figures[0]["props"]["children"][0]["props"]["figure"]
    # each model's heads ranked by the chosen score, names linking to the explorer
    ranking = figures[0]["props"]["children"][2]["props"]["children"]
    links = [row["props"]["children"][0]["props"]["children"]["props"] for row in ranking[1:]]
    assert links[0]["href"].startswith("?page=explorer&models=tiny-mha&layer=")
    model = store.get("tiny-mha")
    table = probe_scores(model, make_probe(model, "random", half_len=6, batch=8))
    best = table.sort_values("induction", ascending=False).index[0]
    assert links[0]["children"] == best and len(links) == len(table)
    assert [a["text"] for a in fig["layout"]["annotations"]] == [
        "previous_token", "duplicate_token", "induction", "induction_stripe"]
    model = store.get("tiny-mha")
    table = probe_scores(model, make_probe(model, "random", half_len=6, batch=8))
    np.testing.assert_allclose(array(fig["data"][2]["z"])[1],
                               table[table["layer"] == 1]["induction"], rtol=0, atol=1e-12)
    assert fig["layout"]["coloraxis"]["colorbar"]["title"]["text"] == "score"
    out = response(app, "heads-scores", values("heads", prompt="abab", heads__probe="text"))
    ann = (out["heads-scores"]["children"][0]["props"]["children"][0]["props"]["figure"]
           ["layout"]["annotations"])
    assert len(ann) == 3 and out["heads-error"]["children"] == ""


@pytest.mark.parametrize("change, message", [
    ({"heads-half.value": 1}, "random tokens per copy 1: tiny-mha fits 2 .. 23"),
    ({"heads-half.value": 24}, "fits 2 .. 23"),
    ({"heads-half.value": "6"}, "random tokens per copy '6'"),
    ({"heads-half.value": None}, "random tokens per copy None"),
    ({"heads-probe.value": "mine"}, "probe 'mine' is not one of"),
    ({"ctl-models.value": ["tiny-mha", "ghost"]}, "unknown model 'ghost'"),
    ({"heads-probe.value": "text", "ctl-applied-prompt.data": "x" * 60}, "reads at most 48"),
])
def test_induction_page_bad_values(app, change, message):
    vals = values("heads")
    vals.update(change)
    out = response(app, "heads-scores", vals)
    assert message in out["heads-error"]["children"]
    assert out["heads-scores"]["children"] == []


def test_a_model_without_the_stage_is_scored_at_its_closest_stage_and_named(app):
    out = response(app, "heads-scores", values("heads", ["tiny-mha", "tiny-dcmha"],
                                               stage="probs"))
    assert len(out["heads-scores"]["children"]) == 2
    assert "tiny-mha has no hook_probs; showing its closest stage hook_pattern" in \
        out["heads-note"]["children"]
    assert "tiny-dcmha" not in out["heads-note"]["children"]


@pytest.mark.parametrize("stage, note", [
    ("probs", "tiny-mha has no hook_probs; showing its closest stage hook_pattern"),
    (None, "tiny-mha: stage None is not a map stage of any model here: showing hook_pattern"),
])
def test_induction_page_falls_back_to_the_closest_stage(app, stage, note):
    out = response(app, "heads-scores", values("heads", stage=stage))
    assert note in out["heads-note"]["children"] and out["heads-error"]["children"] == ""
    assert out["heads-scores"]["children"]


def test_ablation_moves_scores_and_loss(app, store):
    vals = values("heads", ["tiny-dcmha"], heads__ablate_at="probs",
                  heads__ablate_score="induction_stripe", heads__ablate_head="L0H1")
    fig = response(app, "heads-ablation", vals)["heads-ablation"]["figure"]
    before, after = fig["data"]
    model = store.get("tiny-dcmha")
    probe = make_probe(model, "random", half_len=6, batch=8)
    table, loss = ablation_effect(model, probe, [(0, 1)], hook="probs")
    want = table[table["score"] == "induction_stripe"]
    np.testing.assert_allclose(array(after["y"]), want["after"], rtol=0, atol=1e-12)
    assert not np.allclose(array(before["y"]), array(after["y"]))
    assert f"{loss['before']:.3f} -> {loss['after']:.3f}" in fig["layout"]["title"]["text"]


@pytest.mark.parametrize("change, message", [
    ({"heads-ablate-head.value": "L2H0"},
     "layer 2 is not a valid layer of tiny-mha: choose 0 .. 1"),
    ({"heads-ablate-head.value": "L0H9"}, "head 9 is not a valid head"),
    ({"heads-ablate-head.value": "1 or 1=1"}, "knock-out head '1 or 1=1'"),
    ({"heads-ablate-head.value": 3}, "knock-out head 3"),
    ({"heads-ablate-at.value": "probs"}, "knock-out point 'probs' is not z, v or a map stage"),
    ({"heads-ablate-how.value": "random"}, "knock-out 'random' is not one of"),
    ({"heads-ablate-score.value": "nonsense"}, "no score 'nonsense'"),
    ({"heads-probe.value": "text", "ctl-applied-prompt.data": "abab",
      "heads-ablate-score.value": "induction_stripe"}, "no score 'induction_stripe'"),
])
def test_ablation_bad_values(app, change, message):
    vals = values("heads")
    vals.update(change)
    out = response(app, "heads-ablation", vals)
    assert message in out["heads-ablate-error"]["children"]
    assert out["heads-ablation"]["figure"] == {}


def test_composition_and_training_curve_on_the_induction_page(app):
    out = response(app, "heads-composition", values("heads", ["tiny-mha", "tiny-dcmha"]))
    comp = out["heads-composition"]["figure"]
    assert len(comp["data"]) == 1 and comp["layout"]["coloraxis"]["cmid"] == 0
    curve = out["heads-training"]["figure"]["data"]
    assert curve[0]["name"] == "tiny-mha" and array(curve[0]["x"]).tolist() == [2, 4, 6, 8]
    assert "tiny-dcmha: no checkpoint directory" in out["heads-training-note"]["children"]
    assert out["heads-training"]["style"] == {}
    out = response(app, "heads-composition", values("heads", ["one-layer"]))
    assert out["heads-composition"]["figure"] == {}
    assert out["heads-training"]["style"] == {"display": "none"}     # no log: no empty axes
    assert "composition: the composition table is empty" in \
        out["heads-training-note"]["children"]


# -- Circuits page -----------------------------------------------------------------------------

def test_circuits_page_token_circuits(app, store):
    out = response(app, "circuits-qk", values("circuits", ["tiny-dcmha"], "cat", layer=0,
                                              head=1, circuits__kind="composed"))
    qk = out["circuits-qk"]["figure"]["data"][0]
    model = store.get("tiny-dcmha")
    ids = circuit_token_ids(model, model.to_tokens("cat"))
    want = token_circuit(model, 0, 1, ids, "qk", composed=True)
    np.testing.assert_allclose(array(qk["z"]), want.numpy(), rtol=0, atol=1e-12)
    assert qk["x"] == ["c", "a", "t"] and qk["zmid"] == 0 and qk["zmin"] == -qk["zmax"]
    assert out["circuits-ov"]["figure"]["layout"]["yaxis"]["title"]["text"] == \
        "source token (attended to)"
    assert out["circuits-qk"]["config"]["toImageButtonOptions"]["filename"] == \
        "tiny-dcmha_L0H1_composed_qk"
    out = response(app, "circuits-qk", values("circuits", ["tiny-mha"], "cat",
                                              circuits__kind="composed"))
    assert "has no static head mixing" in out["circuits-note"]["children"]
    assert out["circuits-qk"]["figure"]["data"][0]["x"] == ["c", "a", "t"]
    out = response(app, "circuits-qk", values("circuits", ["tiny-mha"], "a b a"))
    assert out["circuits-qk"]["figure"]["data"][0]["x"] == ["a", "␣", "b"]
    assert out["circuits-qk"]["figure"]["data"][0]["texttemplate"] == "%{z:.3g}"
    out = response(app, "circuits-qk", values("circuits", ["tiny-dcmha"], "the cat", layer=1,
                                              head=3, circuits__kind="pair",
                                              circuits__query=5, circuits__key=2))
    model = store.get("tiny-dcmha")
    ids = circuit_token_ids(model, model.to_tokens("the cat"))
    want = token_circuit(model, 1, 3, ids, "ov", True, at=(model.to_tokens("the cat"), 5, 2))
    ov = out["circuits-ov"]["figure"]
    np.testing.assert_allclose(array(ov["data"][0]["z"]), want.numpy(), rtol=0, atol=1e-12)
    assert ov["layout"]["title"]["text"].endswith("full OV circuit at query 5, key 2")


@pytest.mark.parametrize("change, message", [
    ({"ctl-layer.value": 5}, "layer 5 is not a valid layer of tiny-mha"),
    ({"ctl-head.value": 4}, "head 4 is not a valid head of tiny-mha: choose 0 .. 3"),
    ({"ctl-head.value": True}, "head True"),
    ({"circuits-kind.value": "both"}, "circuits 'both' is not one of"),
    ({"ctl-models.value": ["x"]}, "unknown model 'x'"),
    ({"ctl-applied-prompt.data": "x" * 60}, "reads at most 48"),
    ({"circuits-kind.value": "pair", "circuits-query.value": 99},
     "query position 99 is not a valid query position of the prompt (18 tokens)"),
    ({"circuits-kind.value": "pair", "circuits-query.value": 2, "circuits-key.value": 3},
     "key position 3 is not a valid key position of query 2 (causal): choose 0 .. 2"),
    ({"circuits-kind.value": "pair", "circuits-key.value": None}, "key position None"),
    ({"circuits-kind.value": "pair", "circuits-query.value": "1"}, ""),   # URL-style digits
])
def test_circuits_page_bad_values(app, change, message):
    vals = values("circuits")
    vals.update(change)
    out = response(app, "circuits-qk", vals)
    assert message in out["circuits-error"]["children"]
    assert (out["circuits-qk"]["figure"] == {}) == bool(message)


def test_circuits_page_copying_and_composition(app, store):
    out = response(app, "circuits-copying", values("circuits", ["tiny-mta"],
                                                   circuits__kind="composed"))
    copying = out["circuits-copying"]["figure"]["data"][0]
    assert (copying["zmin"], copying["zmax"], copying["zmid"]) == (-1, 1, 0)
    comp = out["circuits-composition"]["figure"]
    assert [t["hovertemplate"].endswith(f"<extra>{m}</extra>") for t, m in
            zip(comp["data"], "QKV", strict=True)] == [True] * 3
    assert "composed composition" in comp["layout"]["title"]["text"]
    out = response(app, "circuits-copying", values("circuits", ["one-layer"]))
    assert out["circuits-composition"]["figure"] == {}
    assert "one layer" in out["circuits-heads-note"]["children"]
    out = response(app, "circuits-copying", values("circuits", circuits__kind=3))
    assert "circuits 3 is not one of" in out["circuits-heads-error"]["children"]


def test_training_log_messages_name_the_model_not_the_server_path(tmp_path):
    from attnlens.dashboards.pages import heads

    store = ModelStore()
    store.add("m", _model("mha"), "ab", directory=tmp_path)
    figure, note = heads.training(store, ["m"])
    assert figure == {} and note == "m: no training log (metrics.jsonl) beside its checkpoint"
    (tmp_path / "metrics.jsonl").write_text("{oops\n")
    _, note = heads.training(store, ["m"])
    assert note.startswith("m: m/metrics.jsonl line 1 is not JSON") and str(tmp_path) not in note


def test_knock_out_points_follow_the_first_model(app):
    out = response(app, "heads-ablate-at", {"ctl-models.value": ["tiny-dcmha"],
                                            "heads-ablate-at.value": "probs"})
    assert "probs" in out["heads-ablate-at"]["options"] and \
        out["heads-ablate-at"]["value"] == "probs"
    out = response(app, "heads-ablate-at", {"ctl-models.value": ["tiny-mha"],
                                            "heads-ablate-at.value": "probs"})
    assert "probs" not in out["heads-ablate-at"]["options"]
    assert out["heads-ablate-at"]["value"] == "z"
    for crafted in ("tiny-mha", [["x"]], 7, None):
        status, _ = call(app, "heads-ablate-at", {"ctl-models.value": crafted})
        assert status == 204


def test_circuits_page_keeps_the_first_distinct_tokens_of_a_long_prompt(app, monkeypatch):
    from attnlens.dashboards.pages import circuits

    monkeypatch.setattr(circuits, "MAX_TOKENS", 3)
    out = response(app, "circuits-qk", values("circuits", prompt="abcabdef"))
    assert out["circuits-qk"]["figure"]["data"][0]["x"] == ["a", "b", "c"]
    assert "showing the first 3 of the prompt's 6 distinct tokens" in \
        out["circuits-note"]["children"]
