"""DCMHA vs MHA recipes of the paper-task zoo: equal parameters, knock-outs, borrowing, report."""

from __future__ import annotations

import pytest
import torch

from attnlens.hooked_models import HookedVariantTransformer, VariantConfig
from attnlens.interp.tasks.conjunction import conjunction_task
from attnlens.lab.paper import dcmha
from attnlens.lab.paper._training import build_model
from attnlens.reports.reproduction import dcmha as dcmha_report


def test_parameter_counts_match():
    for task in dcmha.TASKS:
        counts = dcmha.param_counts(task)
        assert abs(counts["dcmha"] - counts["mha"]) <= 2 * dcmha.D_MODEL + 1   # < one MLP unit
        assert abs(counts["dcmha"] - counts["mha"]) / counts["dcmha"] < 1e-3
    # the generator's size is what the layers really hold
    model = build_model(dcmha.RECIPES["dcmha-conjunction-dcmha-s0"])
    dynamic = sum(p.numel() for n, p in model.named_parameters() if "blocks.0.attn" in n
                  and not any(w in n for w in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K",
                                               "b_V", "b_O")))
    assert dynamic == dcmha.dynamic_params_per_layer()


def test_recipes():
    names = set(dcmha.RECIPES)
    assert {f"dcmha-conjunction-{v}-s{s}" for v in ("dcmha", "mha") for s in (0, 1, 2)} <= names
    for recipe in dcmha.RECIPES.values():
        tokens, mask = dcmha.sampler(recipe)(4, torch.Generator().manual_seed(0))
        assert tokens.shape[1] <= recipe.config["n_ctx"] and mask.sum(1).tolist() == [1.0] * 4
        assert int(tokens.max()) < recipe.config["d_vocab"]


def test_composition_answer_is_appended_where_the_mask_points():
    b, tokens, mask = dcmha._composition_tokens(6, seed=3)
    rows = torch.arange(6)
    assert torch.equal(tokens[rows, b.answer_pos + 1], b.targets)
    assert torch.equal(mask.argmax(1), b.answer_pos)


def test_knockout_is_exactly_mha_with_the_same_weights():
    """Zeroing every dynamic weight (both phases) gives MHA: float64, 1e-10."""
    kw = dict(d_model=32, d_head=8, n_heads=4, n_layers=2, d_mlp=64, n_ctx=32, d_vocab=34,
              positional_embedding_type="rotary", dtype="float64", seed=1)
    dc = HookedVariantTransformer(VariantConfig(attention="dcmha", **kw)).eval()
    mha = HookedVariantTransformer(VariantConfig(attention="mha", **kw)).eval()
    shared = {k: v for k, v in dc.state_dict().items() if k in mha.state_dict()}
    mha.load_state_dict(shared, strict=True)
    tokens = conjunction_task(3, seed=0).tokens
    with torch.no_grad():
        with dc.hooks(fwd_hooks=dcmha.knockout_hooks(dc)):
            knocked = dc(tokens)
        plain, full = mha(tokens), dc(tokens)
    torch.testing.assert_close(knocked, plain, atol=1e-10, rtol=0)
    assert (full - plain).abs().max() > 1e-4           # the composition does something


def test_evaluate_and_borrowing_on_an_untrained_model():
    torch.set_num_threads(1)
    recipe = dcmha.RECIPES["dcmha-conjunction-dcmha-s0"]
    model = build_model(recipe).eval()
    m = dcmha.borrowing_at_answer(model, n=4)
    # near the identity at initialisation: small off-diagonal, diagonal near 1
    assert m["borrow_pre_offdiag_L1"] < 0.05 and abs(m["borrow_pre_diag_L1"] - 1) < 0.05
    mha_recipe = dcmha.RECIPES["dcmha-conjunction-mha-s0"]
    out = dcmha.evaluate(build_model(mha_recipe).eval(), mha_recipe)
    split = {f"attn_L1H{h}_{k}" for h in range(4) for k in ("target", "colour", "shape")}
    assert set(out) == {"accuracy", "acc_twin", "n_params"} | split
    assert 0 <= out["accuracy"] <= 1 and 0 <= out["acc_twin"] <= 1
    # the twin recipes train and evaluate on twin lookups: no separate twin accuracy
    twin_recipe = dcmha.RECIPES["dcmha-conjunction-twin-mha-s0"]
    twin_out = dcmha.evaluate(build_model(twin_recipe).eval(), twin_recipe)
    assert "acc_twin" not in twin_out and 0 <= twin_out["acc_plain"] <= 1
    assert "acc_plain" not in out
    batch = dcmha.lookups(twin_recipe.task_args, 4, seed=1)
    values = batch.tokens[:, 3:19:3]
    assert all((row == a).sum() == 2 for row, a in zip(values, batch.tokens[:, -1], strict=True))
    for h in range(4):   # MHA patterns are distributions: the three groups hold at most 1
        parts = [out[f"attn_L1H{h}_{k}"] for k in ("target", "colour", "shape")]
        assert min(parts) >= 0 and sum(parts) <= 1 + 1e-9


def test_report_section(tmp_path):
    cards = [{"phenomenon": "dcmha-conjunction", "variant": v, "seed": s, "steps": 1000,
              "metrics": {"accuracy": acc + 0.01 * s, "n_params": n, **extra}}
             for v, acc, n, extra in (("dcmha", 0.9, 100, {"acc_no_compose": 0.3}),
                                      ("mha", 0.4, 99, {}))
             for s in (0, 1)]
    text = dcmha_report.report_section(cards)
    assert "DCMHA 0.905, 95% t-interval 0.841 to 0.969 over 2 seeds (0.900 / 0.910)" in text
    assert "MHA 0.405" in text
    assert "| dcmha | 0 | 1000 | 100 | 0.900 | - | 0.300 | - | - | - | - |" in text
    assert "DCMHA is better here" in text and "1/3" in text
    fig = dcmha_report.accuracy_figure(cards)
    ys = [list(t.y) for t in fig.data]
    assert ys == [pytest.approx(y) for y in ([0.9, 0.91], [0.4, 0.41], [0.3, 0.3])]
    assert "No evaluated" in dcmha_report.report_section([])


def test_report_section_does_not_rank_single_seeds():
    cards = [{"phenomenon": "dcmha-composition", "variant": v, "seed": 0, "steps": 1000,
              "metrics": {"accuracy": acc, "n_params": 10}} for v, acc in (("dcmha", 0.33),
                                                                           ("mha", 0.32))]
    text = dcmha_report.report_section(cards)
    assert "One seed on a side, no interval" in text and "better" not in text
    assert "1/3" not in text


def test_comparison_states_the_interval_and_the_winner():
    """Item 17: every MHA seed above every DCMHA seed, separated at 95%: say MHA is better."""
    text = dcmha_report.comparison([0.26, 0.27, 0.265], [0.29, 0.30, 0.295])
    assert "MHA is better here on every seed" not in text   # separated: the plain verdict
    assert "MHA is better here: every MHA seed beats every DCMHA seed; MHA - DCMHA = 3.0 " \
           "points (Welch 95% interval" in text
    overlap = dcmha_report.comparison([0.26, 0.30, 0.28], [0.27, 0.31, 0.29])
    assert "no difference can be claimed" in overlap
    apart = dcmha_report.comparison([0.26, 0.27, 0.30], [0.305, 0.31, 0.36])
    assert "MHA is better here on every seed" in apart and "includes 0" in apart


def test_full_recipes_stop_early_on_held_out_questions(tmp_path):
    """Issue 24 item 3: conjunction to early stopping, DCMHA and MHA at equal parameters,
    3 seeds, validation questions from seeds no training or evaluation batch uses."""
    import json

    from attnlens.lab.paper import _training

    full = {n: r for n, r in dcmha.RECIPES.items() if "-full-" in n}
    assert {(r.variant, r.seed) for r in full.values()} == {
        (v, s) for v in ("dcmha", "mha") for s in dcmha.FULL_SEEDS}
    a, b = full["dcmha-conjunction-full-dcmha-s0"], full["dcmha-conjunction-full-mha-s0"]
    counts = [sum(p.numel() for p in build_model(r).parameters()) for r in (a, b)]
    assert abs(counts[0] - counts[1]) / counts[0] < 0.01
    val = set(range(dcmha.VAL_SEED, dcmha.VAL_SEED + dcmha.VAL_BATCHES))
    assert not val & set(_training.eval_seeds()) and not val & set(dcmha.batch_seeds(a))
    tiny = _training.Recipe(
        name="dcmha-tiny-full-s0", phenomenon="dcmha-conjunction-full", variant="dcmha",
        task="tiny", seed=0, config={**a.config, "n_layers": 1},
        train=dict(steps=300, batch_size=4, lr=3e-3, warmup=1, eval_every=2,
                   early_stop_patience=1, early_stop_min_delta=100.0,
                   early_stop_keep_best=True),
        task_args=a.task_args, module="dcmha")
    _training.train_recipe(tiny, tmp_path / "model", dcmha.sampler(tiny), resume=False,
                           run_root=tmp_path / "runs", evaluate=dcmha.validation(tiny))
    card = json.loads((tmp_path / "model" / "card.json").read_text())
    assert card["stopped_early"] is True and card["steps"] == 4
    # the shipped weights are the best evaluation's (step 2), not the last step's
    assert card["best_step"] == 2 and all(r.train["early_stop_keep_best"] for r in full.values())
