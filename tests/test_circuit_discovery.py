"""attnlens.interp.circuits.discovery (issue 25): the graph of every variant, attribution patching
against exact patching (float64), EAP-IG's completeness, per-edge IG's convergence, within-layer map
edges that matter, circuit extraction, faithfulness, the figure, the CLI and the zoo."""

from __future__ import annotations

import re
from pathlib import Path

import plotly.graph_objects as go
import pytest
import torch

from attnlens.interp.circuits.discovery import (
    build_graph,
    circuit_figure,
    discover,
    eap_ig,
    edge_ig,
    exact_patching,
    faithfulness,
    induction_task,
    logprob_metric,
    prune,
    select_edges,
)
from attnlens.interp.circuits.discovery.engine import run
from attnlens.interp.circuits.discovery.scoring import attribution_patching

from helpers import random_tokens, tiny_model

VARIANTS = ("mha", "mta", "cope", "dcmha", "infini")
OPTIONS = {
    "mta": dict(positional_embedding_type="rotary", attn_cfg=dict(
        query_kernel_size=2, key_kernel_size=3, after_sm_query_kernel_size=2,
        after_sm_key_kernel_size=3, head_kernel_size=2, pre_sm_head_kernel_size=2,
        init_method="uniform")),
    "dcmha": dict(positional_embedding_type="rotary"),
    "infini": dict(positional_embedding_type="rotary", attn_cfg=dict(segment_len=4)),
}


def _model(variant: str):
    torch.manual_seed(0)
    model = tiny_model(variant, dtype=torch.float64, **OPTIONS.get(variant, {}))
    if variant == "mta":   # identity-initialised head mixing has no cross-head weight yet
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for block in model.blocks:
                for kernel in (block.attn.pre_sm_head_kernel, block.attn.head_kernel):
                    kernel.add_(0.5 * torch.randn(kernel.shape, generator=gen,
                                                  dtype=kernel.dtype))
    if variant == "dcmha":   # the released init composes almost nothing: make Compose visible
        with torch.no_grad():
            for block in model.blocks:
                block.attn.qkw.mul_(30.0)
                block.attn.dd.mul_(10.0)
    return model


@pytest.fixture(scope="module", params=VARIANTS)
def setup(request):
    model = _model(request.param)
    graph = build_graph(model)
    clean, corrupted = random_tokens(model, 2, 8, seed=0), random_tokens(model, 2, 8, seed=1)
    return request.param, model, graph, clean, corrupted, logprob_metric(clean, range(2, 7))


def _sample(graph, n_resid: int = 6):
    resid = graph.edges_of("resid")
    step = max(1, len(resid) // n_resid)
    return resid[::step] + graph.edges_of("mix")[:4] + graph.edges_of("sub")[:2]


def test_graph_shape(setup):
    variant, model, graph, *_ = setup
    H, L = model.cfg.n_heads, model.cfg.n_layers
    heads = [n for n in graph.nodes.values() if n.kind == "head"]
    assert len(heads) == H * L and "input" in graph.nodes and "logits" in graph.nodes
    assert graph.nodes["MLP1"].kind == "mlp"
    # every upstream output reaches the logits directly
    assert {e.src for e in graph.edges if e.dst == "logits"} == set(graph.outputs)
    expect_mix = variant in ("mta", "dcmha")
    assert bool(graph.edges_of("mix")) == expect_mix
    assert bool(graph.edges_of("sub")) == (variant == "infini")
    assert bool(graph.shared_input_layers) == (variant == "dcmha")   # dynamic weights read x
    if expect_mix:
        phases = {e.port for e in graph.edges_of("mix")}
        assert phases == {"pre", "post"}
        assert all(e.src_head != e.dst_head for e in graph.edges_of("mix"))
    names = [e.name for e in graph.edges]
    assert len(names) == len(set(names))
    assert not model.cfg.use_split_qkv_input and not model.cfg.use_attn_result   # restored


def test_shared_code_names_no_variant():
    """Variants plug in through the catalogue and the mixing seam, never by name."""
    for path in Path("interp/circuits/discovery").glob("*.py"):
        code = path.read_text()
        if path.name == "report.py":   # lists the bundled zoo names
            continue
        assert not re.search(r"""["'](mha|mta|cope|dcmha|infini)["']""", code), path


def test_all_edges_patched_is_the_corrupted_run(setup):
    """Patching every edge composes exactly: the clean run becomes the corrupted run."""
    _, model, graph, clean, corrupted, metric = setup
    ref = run(model, graph, corrupted, metric)
    everything = run(model, graph, clean, metric, patch={e: 1.0 for e in graph.edges},
                     reference=ref)
    assert everything.metric == pytest.approx(ref.metric, abs=1e-10)
    with torch.no_grad():
        plain = metric(model(clean))
    assert run(model, graph, clean, metric).metric == pytest.approx(float(plain), abs=1e-12)


def test_attribution_matches_linearised_exact_patching(setup):
    """First-order scores == the derivative of exact patching along each edge (finite
    difference with a 1e-6 step), for residual, map and memory edges."""
    _, model, graph, clean, corrupted, metric = setup
    scores = attribution_patching(model, graph, clean, corrupted, metric).set_index("edge")
    edges = _sample(graph)
    eps = 1e-6
    fd = exact_patching(model, graph, clean, corrupted, metric, edges, coefficient=eps)
    for name, value in zip(fd.edge, fd.score, strict=True):
        first = scores.loc[name, "score"]
        assert value / eps == pytest.approx(first, rel=1e-4, abs=1e-9), name


def test_eap_ig_completeness(setup):
    """EAP-IG over the edges leaving the input sums to metric(corrupted) - metric(clean) as
    steps grow (it would not if the graph missed a reader of the residual stream)."""
    _, model, graph, clean, corrupted, metric = setup
    total = run(model, graph, corrupted, metric).metric - run(model, graph, clean, metric).metric
    errors = []
    for steps in (2, 12):
        table = eap_ig(model, graph, clean, corrupted, metric, steps)
        errors.append(abs(table[table.src == "input"].score.sum() - total))
    assert errors[1] < errors[0] and errors[1] < 0.02 * abs(total) + 1e-9


def test_edge_ig_converges_to_exact_patching(setup):
    _, model, graph, clean, corrupted, metric = setup
    edges = _sample(graph, 2)[:4]
    exact = exact_patching(model, graph, clean, corrupted, metric, edges).score.to_numpy()
    coarse = edge_ig(model, graph, clean, corrupted, metric, edges, 1).score.to_numpy()
    fine = edge_ig(model, graph, clean, corrupted, metric, edges, 8).score.to_numpy()
    err_coarse, err_fine = abs(coarse - exact).max(), abs(fine - exact).max()
    assert err_fine <= err_coarse + 1e-12
    assert err_fine < 0.02 * abs(exact).max() + 1e-12


@pytest.mark.parametrize("variant", ["mta", "dcmha"])
def test_map_edges_matter(variant):
    """Within-layer map edges carry signal: nonzero scores, and patching them changes the
    metric (one at a time and all together)."""
    model = _model(variant)
    graph = build_graph(model)
    clean, corrupted = random_tokens(model, 2, 8, seed=0), random_tokens(model, 2, 8, seed=1)
    metric = logprob_metric(clean, range(2, 7))
    maps = graph.edges_of("mix")
    scores = attribution_patching(model, graph, clean, corrupted, metric)
    assert (scores[scores.kind == "mix"].abs_score > 1e-9).all()
    exact = exact_patching(model, graph, clean, corrupted, metric, maps[:6])
    assert exact.score.abs().max() > 1e-6
    ref = run(model, graph, corrupted)
    base = run(model, graph, clean, metric).metric
    together = run(model, graph, clean, metric, patch={e: 1.0 for e in maps}, reference=ref)
    assert abs(together.metric - base) > 1e-6


def test_select_prune_and_faithfulness():
    model = _model("mha")
    graph = build_graph(model)
    clean, corrupted = random_tokens(model, 2, 8, seed=0), random_tokens(model, 2, 8, seed=1)
    metric = logprob_metric(clean, range(2, 7))
    by_name = {e.name: e for e in graph.edges}
    # L0H0 feeds nothing downstream here: the edge into it is pruned away
    chain = [by_name["input->L0H1.v"], by_name["L0H1->L1H2.k"], by_name["L1H2->logits"],
             by_name["input->L0H0.q"]]
    assert prune(graph, chain) == chain[:3]
    scores = attribution_patching(model, graph, clean, corrupted, metric)
    circuit = select_edges(graph, scores, top_k=10)
    assert len(circuit) >= 10 and prune(graph, circuit) == circuit
    assert select_edges(graph, scores, threshold=float("inf")) == []
    with pytest.raises(ValueError, match="exactly one"):
        select_edges(graph, scores)
    full = faithfulness(model, graph, graph.edges, clean, corrupted, metric)
    empty = faithfulness(model, graph, [], clean, corrupted, metric)
    assert full["faithfulness"] == pytest.approx(1.0, abs=1e-9)
    assert empty["faithfulness"] == pytest.approx(0.0, abs=1e-9)
    mean = faithfulness(model, graph, circuit, clean, corrupted, metric, "mean")
    assert mean["ablation"] == "mean" and mean["edges"] == len(circuit)
    fig = circuit_figure(graph, scores, circuit)
    assert isinstance(fig, go.Figure) and len(fig.data) == len(circuit) + 1


def test_zoo_induction_mha_recovered():
    from attnlens.hooked_models import zoo
    from attnlens.interp.circuits.discovery import induction_heads, recovery

    model = zoo.load("induction-mha")
    task = induction_task(model, n_prompts=8, half_len=8, seed=0)
    found = discover(model, task, top_k=20)
    heads = induction_heads(model, task)
    rec = recovery(found.graph, found.scores, found.circuit, heads)
    assert heads["previous_token"] == ["L0H1"]
    assert rec["recovered"] and rec["k_composition"], rec
    assert found.faithfulness["faithfulness"] > 0.9


def test_recovery_counts_a_layer_0_induction_head_as_one_layer():
    """A layer-0 induction head writing to the logits has no earlier head to compose with: it
    is recovered as a one-layer circuit; a later layer's head still needs K-composition."""
    import pandas as pd

    from attnlens.interp.circuits.discovery import recovery

    graph = build_graph(tiny_model("mta"))
    scores = pd.DataFrame({"edge": [e.name for e in graph.edges],
                           "abs_score": [1.0] * len(graph.edges)})
    by_name = {e.name: e for e in graph.edges}
    heads = {"previous_token": ["L0H0"], "induction": ["L0H1", "L1H2"]}
    one = recovery(graph, scores, [by_name["L0H1->logits"]], heads)
    assert one["one_layer"] == ["L0H1"] and one["recovered"] and not one["k_composition"]
    later = recovery(graph, scores, [by_name["L1H2->logits"]], heads)
    assert later["one_layer"] == [] and not later["recovered"]
    both = recovery(graph, scores, [by_name["L1H2->logits"], by_name["L0H0->L1H2.k"]], heads)
    assert both["recovered"] and both["k_composition"] == ["L0H0->L1H2.k"]


def test_cli_circuit(tmp_path, capsys):
    from attnlens.cli import main

    assert main(["circuit", "induction-mha", "--prompts", "4", "--steps", "3",
                 "--out", str(tmp_path), "--no-png"]) == 0
    out = capsys.readouterr().out
    assert "faithfulness" in out and "L0H1->" in out
    assert (tmp_path / "circuit.html").is_file() and (tmp_path / "circuit.json").is_file()
    # the page opens offline: plotly.js is beside it, not on a CDN
    page = (tmp_path / "circuit.html").read_text()
    assert 'src="plotly.min.js"' in page and "cdn.plot.ly" not in page
    assert (tmp_path / "plotly.min.js").stat().st_size > 1_000_000
    with pytest.raises(SystemExit, match="neither"):
        main(["circuit", "no-such-model"])


def test_cli_circuit_paper_tasks(capsys):
    """`attnlens circuit --task findblock | conjunction-value` on the shipped paper-task models:
    MTA's find-the-block circuit runs through L0H1; DCMHA's value-copy graph has Compose edges."""
    from attnlens.cli import main

    assert main(["circuit", "mta-findblock-last-mta-s0", "--task", "findblock", "--prompts",
                 "4", "--steps", "3", "--top-k", "10"]) == 0
    out = capsys.readouterr().out
    assert "find the block" in out and "L0H1->logits" in out and "'mix_edges': 0" in out
    assert main(["circuit", "dcmha-conjunction-dcmha-s0", "--task", "conjunction-value",
                 "--prompts", "4", "--steps", "3"]) == 0
    out = capsys.readouterr().out
    assert "'mix_edges': 48" in out and "faithfulness" in out
