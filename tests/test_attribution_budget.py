"""Budgeted attribution (issue 55, item 1): features chosen by influence up to a node budget,
a memory budget that refuses what cannot fit before any row is computed, and a report of what
was left out. With a budget covering every active feature the graph is the full graph,
bit for bit; with a smaller one, every edge kept is the full graph's edge and the left-out
features' effects are accounted for exactly."""

import json

import pytest
import torch
from attribution_models import model_and_transcoders, prompt, write_cope_checkpoint

from attnlens.cli import main
from attnlens.commands import graph as graph_command
from attnlens.interp.attribution import budget as budget_module
from attnlens.interp.attribution import graph as graph_module
from attnlens.interp.attribution.budget import AttributionBudget, parse_memory
from attnlens.interp.attribution.export import graph_to_json
from attnlens.interp.attribution.graph import attribute
from attnlens.interp.attribution.prune import prune


@pytest.fixture(scope="module")
def full():
    model, tcs = model_and_transcoders("dcmha")
    g = attribute(model, tcs, prompt(model), batch_size=16, max_logits=3,
                  budget=AttributionBudget.unbounded())
    return model, tcs, g


def _same(a, b):
    for name in ("adjacency", "bias", "target_values", "features", "activations",
                 "logit_tokens"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name


def test_a_budget_covering_every_feature_gives_the_full_graph(full):
    model, tcs, g = full
    assert g.budget.n_left_out == 0 and g.budget.n_active == g.n_features
    for budget in (None, AttributionBudget(max_feature_nodes=g.n_features),
                   AttributionBudget(max_feature_nodes=10**6, memory="1GB")):
        other = attribute(model, tcs, prompt(model), batch_size=16, max_logits=3, budget=budget)
        _same(g, other)
        assert other.budget.n_left_out == 0 and "all" in other.budget.summary()


@pytest.mark.parametrize("share", [0.2, 0.5])
def test_a_smaller_budget_keeps_exact_edges_and_accounts_for_the_rest(full, share):
    model, tcs, g = full
    k = int(g.n_features * share)
    b = attribute(model, tcs, prompt(model), batch_size=5, max_logits=3,
                  budget=AttributionBudget(max_feature_nodes=k))
    report = b.budget
    assert b.n_features == k == report.n_selected and report.n_left_out == g.n_features - k
    # the chosen features, in the full graph's node order
    index = torch.tensor([g.feature_index(*f) for f in b.features.tolist()])
    assert (index.diff() > 0).all()
    left = sorted(set(range(g.n_features)) - set(index.tolist()))
    assert sorted(g.feature_index(*f) for f in report.left_out.tolist()) == left
    # every kept edge is the full graph's (rows over errors, embeddings too); logit rows alike
    rows = torch.cat([index, torch.arange(g.n_nodes - g.n_logits, g.n_nodes)])
    b_rows = torch.cat([torch.arange(k), torch.arange(b.n_nodes - b.n_logits, b.n_nodes)])
    cols = torch.cat([index, torch.arange(g.n_features, g.n_nodes - g.n_logits)])
    torch.testing.assert_close(b.adjacency[b_rows][:, :b.n_nodes - b.n_logits],
                               g.adjacency[rows][:, cols], atol=1e-12, rtol=0)
    torch.testing.assert_close(b.target_values[b_rows], g.target_values[rows], atol=1e-12,
                               rtol=0)
    torch.testing.assert_close(b.bias[b_rows], g.bias[rows], atol=1e-12, rtol=0)
    # nothing silently dropped: the left-out features' direct effects, exactly
    dropped = g.adjacency[rows][:, left].sum(1)
    torch.testing.assert_close(report.dropped_effect[b_rows], dropped, atol=1e-12, rtol=0)
    totals = b.adjacency[b_rows].sum(1) + b.bias[b_rows] + report.dropped_effect[b_rows]
    torch.testing.assert_close(totals, b.target_values[b_rows], atol=1e-11, rtol=0)
    target = g.adjacency[g.logit_index(0)].abs()
    assert report.target_effect_left_out == pytest.approx(
        float(target[left].sum() / target.sum()), abs=1e-12)
    assert 0 <= report.influence_left_out < 1
    assert report.left_out_influence.diff().le(0).all()          # most influential first
    info = graph_to_json(b, "budget")["metadata"]["info"]["budget"]
    assert info["features_in_graph"] == k and info["features_left_out"] == len(left)
    assert len(info["top_left_out"]) == min(10, len(left))
    json.dumps(info)
    assert f"{len(left)} left out" in report.summary()


def test_the_budget_takes_the_most_influential_features(full):
    """Chosen by estimated influence, the features kept carry far more of the full graph's
    influence than the same number chosen blindly (the first by index)."""
    model, tcs, g = full
    truth = prune(g).node_influence[:g.n_features]
    k = g.n_features // 5
    b = attribute(model, tcs, prompt(model), batch_size=4, max_logits=3,
                  budget=AttributionBudget(max_feature_nodes=k))
    chosen = torch.tensor([g.feature_index(*f) for f in b.features.tolist()])
    best = truth.sort(descending=True).values[:k].sum()
    assert int(truth.argmax()) in chosen.tolist()
    assert truth[chosen].sum() >= 0.9 * best
    assert truth[chosen].sum() > 1.5 * truth[:k].sum()


def test_float64_on_request():
    model, tcs = model_and_transcoders("mha-rotary")
    model32 = model.to(torch.float32)
    g = attribute(model32, tcs, prompt(model32), max_logits=2)
    assert g.adjacency.dtype == torch.float32 and model32.cfg.dtype == torch.float32
    g64 = attribute(model32, tcs, prompt(model32), max_logits=2, dtype=torch.float64)
    assert g64.adjacency.dtype == torch.float64 and model32.cfg.dtype == torch.float32
    torch.testing.assert_close(g64.adjacency.float(), g.adjacency, atol=1e-4, rtol=1e-3)
    with pytest.raises(ValueError, match="dtype must be torch.float32 or torch.float64"):
        attribute(model32, tcs, prompt(model32), dtype=torch.float16)


@pytest.mark.parametrize("kwargs, message", [
    (dict(max_feature_nodes=0), "max_feature_nodes must be a positive int"),
    (dict(max_feature_nodes=-3), "max_feature_nodes must be a positive int"),
    (dict(max_feature_nodes=True), "max_feature_nodes must be a positive int"),
    (dict(max_feature_nodes=2.5), "max_feature_nodes must be a positive int"),
    (dict(memory="lots"), "memory budget must be a size such as 2GB"),
    (dict(memory="2XB"), "memory budget must be a size"),
    (dict(memory=1000), "under 1 MB"),
    (dict(memory=True), "memory budget must be a size"),
])
def test_bad_budgets_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        AttributionBudget(**kwargs)


def test_parse_memory():
    assert parse_memory("2GB") == 2 * 10**9 and parse_memory("512 MiB") == 512 * 2**20
    assert parse_memory("1.5gb") == 1_500_000_000 and parse_memory("none") is None
    assert parse_memory(None) is None and parse_memory(3 * 10**6) == 3 * 10**6


def test_a_graph_over_the_memory_budget_is_refused_before_any_row(monkeypatch):
    model, tcs = model_and_transcoders("dcmha")

    def no_rows(*args, **kwargs):
        raise AssertionError("a row was computed before the budget was checked")
    monkeypatch.setattr(graph_module._RowMaker, "__call__", no_rows)
    monkeypatch.setattr(budget_module, "copy_bytes", lambda *a: 600 * 10**6)
    with pytest.raises(ValueError, match="does not fit the memory budget of 0.50 GB.*lower the "
                                         "node budget"):
        attribute(model, tcs, prompt(model), budget=AttributionBudget(memory="500MB"))
    with pytest.raises(ValueError, match="batch_size 3 needs about 1.80 GB"):
        attribute(model, tcs, prompt(model), batch_size=3,
                  budget=AttributionBudget(memory="1.5GB"))


def test_the_batch_size_follows_the_memory_budget(monkeypatch):
    model, tcs = model_and_transcoders("mha-rotary")
    monkeypatch.setattr(budget_module, "copy_bytes", lambda *a: 10**8)
    g = attribute(model, tcs, prompt(model), max_logits=2,
                  budget=AttributionBudget(memory="350MB"))
    assert g.budget.batch_size == 3
    g = attribute(model, tcs, prompt(model), max_logits=2, budget=AttributionBudget(memory=None))
    assert g.budget.batch_size == budget_module.MAX_BATCH


def test_the_cli_defaults_are_the_budget_defaults():
    assert graph_command.DEFAULT_MAX_FEATURE_NODES == budget_module.DEFAULT_MAX_FEATURE_NODES
    assert graph_command.DEFAULT_MEMORY == budget_module.DEFAULT_MEMORY


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_cope_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-cope")


@pytest.mark.parametrize("option, value, message", [
    ("--max-features", "0", "argument --max-features: must be a positive number of features"),
    ("--max-features", "-5", "argument --max-features: must be a positive number"),
    ("--max-features", "many", "argument --max-features: must be a positive number"),
    ("--memory", "lots", "argument --memory: memory budget must be a size such as 2GB"),
    ("--memory", "10KB", "argument --memory: memory budget '10KB' is under 1 MB"),
])
def test_the_cli_refuses_bad_budgets_before_loading(option, value, message, checkpoint, capsys,
                                                     monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the graph was computed before the arguments were checked")
    monkeypatch.setattr(graph_module, "attribute", refuse)
    with pytest.raises(SystemExit) as info:
        main(["graph", str(checkpoint), "the cat", option, value])
    assert info.value.code == 2
    assert message in capsys.readouterr().err.strip().splitlines()[-1]


def test_the_cli_reports_what_the_budget_left_out(checkpoint, tmp_path, capsys, monkeypatch):
    out = tmp_path / "g"
    assert main(["graph", str(checkpoint), "the cat sat. the cat", "--max-features", "6",
                 "--out", str(out), "--slug", "b", "--no-progress", "--show", "2"]) == 0
    text = capsys.readouterr().out
    assert "budget 6 features: 6 of " in text and "most influential features left out" in text
    info = json.loads((out / "b.json").read_text())["metadata"]["info"]["budget"]
    assert info["features_in_graph"] == 6 and info["features_left_out"] > 0
    with monkeypatch.context() as patch:
        patch.setattr(budget_module, "copy_bytes", lambda *a: 2 * 10**6)
        with pytest.raises(SystemExit, match="does not fit the memory budget of 1.0 MB"):
            main(["graph", str(checkpoint), "the cat", "--memory", "1MB", "--no-progress",
                  "--max-features", "all"])
    assert main(["graph", str(checkpoint), "the cat", "--float64", "--max-features", "all",
                 "--no-progress", "--show", "0"]) == 0
    assert "all " in capsys.readouterr().out
