"""docs/circuit_discovery.md on the 4-layer text models: in MHA, Infini and CoPE the induction
circuit runs from the first MLP through a layer-1 previous-token head into last-layer induction
heads, and is spread over more edges than the 2-layer models'; MTA's stays in layer 0, with its
pre-softmax head mixing (ranks, faithfulness and the mixing numbers recomputed here)."""

from __future__ import annotations

import re

import pytest
import torch
from tiers import reproduce

from attnlens.hooked_models.zoo import available
from attnlens.interp.circuits.discovery.discover import discover
from attnlens.interp.circuits.discovery.extract import faithfulness_curve
from attnlens.interp.circuits.discovery.induction import induction_task
from attnlens.interp.circuits.discovery.report import load, model_rows
from attnlens.interp.tasks.induction import repeated_tokens

# 6.5 minutes of circuit search on the 4-layer models: the reproduce tier (make reproduce); the
# fast tier re-derives the documented circuit of text-mha-l2 (test_circuit_docs_text.py).
pytestmark = reproduce("circuit")

# model: {edge: rank among all edges by |EAP-IG score|}, {circuit size: faithfulness}
DOCUMENTED = {
    "text-mha-l4mlp": ({"input->MLP0": 1, "L1H1->L3H2.k": 3, "MLP0->L1H1.v": 4,
                        "L1H1->L3H1.k": 8, "L2H1->L3H2.k": 13, "L2H2->L3H2.k": 17},
                       {20: 0.59, 100: 0.90, 150: 0.95}),
    "text-infini-l4mlp": ({"input->MLP0": 1, "L1H3->L3H1.k": 3, "MLP0->L1H3.v": 4},
                          {20: 0.51, 100: 0.86, 150: 0.94}),
    "text-cope-l4mlp": ({"input->MLP0": 1, "MLP0->L1H3.v": 3, "L1H3->L3H1.k": 4,
                         "L1H3->L3H0.k": 6, "L1H3->L3H2.k": 8},
                        {20: 0.56, 100: 0.92, 150: 0.96}),
}


def _discovered(name: str):
    """The docs' command on `name`: 32 prompts of |r| = 20 (seed 0), EAP-IG with 10 steps; the
    model, the task, the search and every edge ranked by |score|."""
    torch.manual_seed(0)
    model = load(name)
    task = induction_task(model, n_prompts=32, half_len=20, seed=0)
    found = discover(model, task, "eap-ig", steps=10, top_k=20)
    return model, task, found, found.scores.sort_values("abs_score", ascending=False).edge.tolist()


@pytest.mark.parametrize("name", sorted(DOCUMENTED))
def test_the_4_layer_circuit_reads_mlp0_through_a_layer_1_previous_token_head(name):
    if name not in available():
        pytest.skip(f"{name} is not shipped")
    model, task, found, ranked = _discovered(name)
    ranks, curve = DOCUMENTED[name]
    assert {edge: ranked.index(edge) + 1 for edge in ranks} == ranks
    assert [found.scores.set_index("edge").score[e] < 0 for e in ranks] == [True] * len(ranks)
    got = faithfulness_curve(model, found.graph, found.scores, task.clean, task.corrupted,
                             task.metric, sizes=tuple(curve))
    for size, faith in curve.items():
        row = got[got.top_k == size]
        assert float(row.faithfulness.iloc[0]) == pytest.approx(faith, abs=0.01), size


def _layers(edge: str) -> set[int]:
    """The layers of the heads and MLPs an edge joins (`input` and `logits` have none)."""
    return {int(n) for n in re.findall(r"(?:L|MLP)(\d+)", edge)}


def test_mta_4_layer_model_copies_in_layer_0_through_its_pre_softmax_mixing():
    name = "text-mta-l4mlp"
    if name not in available():
        pytest.skip(f"{name} is not shipped")
    model, task, found, ranked = _discovered(name)
    assert len(ranked) == 575                      # MHA's 479 + 12 head pairs x 2 x 4 layers
    ranks = {"input->L0H3.k": 1, "L0H3->logits": 2, "L0H1->logits": 3, "L0H3->L0H1[pre]": 7,
             "L0H2->logits": 8, "MLP3->logits": 15}
    assert {edge: ranked.index(edge) + 1 for edge in ranks} == ranks
    later = [e for e in ranked[:20] if _layers(e) - {0}]
    assert later == ["MLP3->logits"]
    curve = faithfulness_curve(model, found.graph, found.scores, task.clean, task.corrupted,
                               task.metric, sizes=(20, 100))
    assert curve.faithfulness.tolist() == pytest.approx([0.82, 1.01], abs=0.01)
    torch.manual_seed(0)
    top, within = model_rows(name, half_len=20)
    assert top["induction heads"] == "L0H1 L0H2 L0H3" and top["how"] == "one layer"
    assert within["edges for faith >= 0.9"] == 40 and within["within-layer edges in it"] == 12
    assert within["its faith"] == pytest.approx(0.92, abs=0.01)
    assert within["faith without them"] == pytest.approx(0.21, abs=0.01)
    assert within["all within-layer edges patched (metric change)"] == pytest.approx(-6.82,
                                                                                      abs=0.02)
    edge, change = within["strongest single one (exact change)"].split(": ")
    assert edge == "L0H3->L0H1[pre]" and float(change) == pytest.approx(-2.29, abs=0.01)


def test_dcmha_4_layer_model_hands_its_induction_map_between_last_layer_heads():
    """text-dcmha-l4mlp: MHA's circuit (input -> MLP0 -> previous-token head L1H0's values ->
    the keys of last-layer heads), but the last layer's heads exchange their maps through
    Compose: L3H2 attends on the induction stripe (its softmax) and hands that map to L3H0 and
    L3H1, whose composed patterns carry it; L3H1 has almost none of its own."""
    name = "text-dcmha-l4mlp"
    if name not in available():
        pytest.skip(f"{name} is not shipped")
    model, task, found, ranked = _discovered(name)
    assert len(ranked) == 609
    ranks = {"input->MLP0": 1, "L3H1->logits": 2, "L3H0->logits": 3, "MLP0->L1H0.v": 4,
             "L1H0->L3H2.k": 5, "L3H2->logits": 6, "L1H0->L3H0.k": 7, "L3H0->L3H2[pre]": 8,
             "L3H2->L3H0[pre]": 9, "L3H2->L3H1[post]": 10, "L3H2->L3H0[post]": 14}
    assert {edge: ranked.index(edge) + 1 for edge in ranks} == ranks
    curve = faithfulness_curve(model, found.graph, found.scores, task.clean, task.corrupted,
                               task.metric, sizes=(20, 40, 100, 150, 200))
    assert curve.faithfulness.tolist() == pytest.approx([0.38, 0.63, 0.81, 0.92, 0.97],
                                                        abs=0.01)
    # the induction stripe of each last-layer head at the softmax (`probs`) and after Compose
    # (`pattern`), read straight off the cache: [BOS] r r, |r| = 20, 8 prompts, probe seed
    tokens = repeated_tokens(8, 20, model.cfg.d_vocab, seed=20261125)
    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n.startswith("blocks.3.attn"))
    q = torch.arange(21, 41)

    def stripe(stage):
        return cache[f"blocks.3.attn.hook_{stage}"][:, :, q, q - 19].mean((0, 2)).tolist()

    assert stripe("probs") == pytest.approx([0.615, 0.071, 0.656, 0.405], abs=0.005)
    assert stripe("pattern") == pytest.approx([2.323, 2.284, -0.041, -0.193], abs=0.005)
    # the README's numbers, on the zoo's probe (|r| = 150)
    tokens = repeated_tokens(8, 150, model.cfg.d_vocab, seed=20261125)
    _, cache = model.run_with_cache(tokens, names_filter="blocks.3.attn.hook_probs")
    q = torch.arange(151, 301)
    probs = cache["blocks.3.attn.hook_probs"][:, :, q, q - 149].mean((0, 2)).tolist()
    assert probs == pytest.approx([0.614, 0.022, 0.742, 0.217], abs=0.005)
    torch.manual_seed(0)
    top, within = model_rows(name, half_len=20)
    assert top["prev-token heads"] == "L1H0" and top["induction heads"] == "L3H0 L3H1"
    assert top["K-composition edges (of possible)"] == "1 of 2: L1H0->L3H0.k"
    assert within["edges for faith >= 0.9"] == "> 100"            # 150 edges are needed
    assert within["its faith"] == pytest.approx(0.81, abs=0.01)
    assert within["within-layer edges in it"] == 18
    assert within["faith without them"] == pytest.approx(0.12, abs=0.01)
    assert within["all within-layer edges patched (metric change)"] == pytest.approx(-5.91,
                                                                                     abs=0.02)
    assert within["strongest single one (exact change)"] == "L3H0->L3H2[pre]: -2.028"
