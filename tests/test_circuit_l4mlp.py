"""docs/circuit_discovery.md on the 4-layer text models: the induction circuit runs from the first
MLP through a layer-1 previous-token head into last-layer induction heads, and is spread over
more edges than the 2-layer models' (ranks and faithfulness recomputed here)."""

from __future__ import annotations

import pytest
import torch

from hooked_models.zoo import available
from interp.circuit_discovery.discover import discover
from interp.circuit_discovery.extract import faithfulness_curve
from interp.circuit_discovery.induction import induction_task
from interp.circuit_discovery.report import load

# model: {edge: rank among all edges by |EAP-IG score|}, {circuit size: faithfulness}
DOCUMENTED = {
    "text-mha-l4mlp": ({"input->MLP0": 1, "L1H1->L3H2.k": 3, "MLP0->L1H1.v": 4,
                        "L1H1->L3H1.k": 8, "L2H1->L3H2.k": 13, "L2H2->L3H2.k": 17},
                       {20: 0.59, 100: 0.90, 150: 0.95}),
    "text-infini-l4mlp": ({"input->MLP0": 1, "L1H3->L3H1.k": 3, "MLP0->L1H3.v": 4},
                          {20: 0.51, 100: 0.86, 150: 0.94}),
}


@pytest.mark.parametrize("name", sorted(DOCUMENTED))
def test_the_4_layer_circuit_reads_mlp0_through_a_layer_1_previous_token_head(name):
    if name not in available():
        pytest.skip(f"{name} is not shipped")
    torch.manual_seed(0)
    model = load(name)
    task = induction_task(model, n_prompts=32, half_len=20, seed=0)   # the docs' command
    found = discover(model, task, "eap-ig", steps=10, top_k=20)
    ranked = found.scores.sort_values("abs_score", ascending=False).edge.tolist()
    ranks, curve = DOCUMENTED[name]
    assert {edge: ranked.index(edge) + 1 for edge in ranks} == ranks
    assert [found.scores.set_index("edge").score[e] < 0 for e in ranks] == [True] * len(ranks)
    got = faithfulness_curve(model, found.graph, found.scores, task.clean, task.corrupted,
                             task.metric, sizes=tuple(curve))
    for size, faith in curve.items():
        row = got[got.top_k == size]
        assert float(row.faithfulness.iloc[0]) == pytest.approx(faith, abs=0.01), size
