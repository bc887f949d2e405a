"""The lr probe of the paper-task recipes (attnlens.lab.paper.lr_probe): the -full DCMHA/MHA
recipes train at the lr their validation probe chose, and the probe does what it says."""

from __future__ import annotations

import dataclasses

import pytest

from attnlens.lab.paper import dcmha, lr_probe
from attnlens.reports.reproduction import dcmha as dcmha_report
from attnlens.reports.reproduction.page import FIGURES


def _tiny(variant: str):
    recipe = dcmha.RECIPES[f"dcmha-conjunction-full-{variant}-s0"]
    return dataclasses.replace(recipe, name=f"tiny-{variant}",
                               train={**recipe.train, "batch_size": 4, "warmup": 1})


def test_probe_records_validation_at_every_lr(tmp_path):
    rows = lr_probe.run_probe([_tiny("dcmha")], [1e-3, 1e-2], steps=4, eval_every=2,
                              progress=lambda s: None)
    assert [(r["lr"], r["step"]) for r in rows] == [(1e-3, 2), (1e-3, 4), (1e-2, 2), (1e-2, 4)]
    assert all(r["variant"] == "dcmha" and r["val_loss"] > 0 for r in rows)
    # the two lrs train differently from the same seed and batches
    assert rows[1]["val_loss"] != rows[3]["val_loss"]
    back = lr_probe.read_csv(lr_probe.write_csv(rows, tmp_path / "probe.csv"))
    assert back == rows
    with pytest.raises(ValueError, match="shorter than eval_every"):
        lr_probe.probe_recipe(_tiny("mha"), 1e-3, steps=1, eval_every=2)


def test_best_lr_is_the_lowest_last_validation_loss():
    rows = [dict(recipe="r", variant=v, lr=lr, step=s, val_loss=x)
            for v, lr, s, x in [("a", 1e-3, 250, 1.0), ("a", 1e-3, 500, 0.9),
                                ("a", 3e-3, 250, 0.5), ("a", 3e-3, 500, 0.95),
                                ("b", 1e-3, 500, 2.0), ("b", 3e-4, 500, 1.5)]]
    assert lr_probe.best_lrs(rows) == {"a": 1e-3, "b": 3e-4}
    table = lr_probe.table(rows, every=250)
    assert "| a | 0.001 (chosen) | 1.000 | 0.900 |" in table
    assert "| a | 0.003 | 0.500 | 0.950 |" in table


def test_full_recipes_train_at_the_probed_lr():
    """Issue 24 item 3: the DCMHA vs MHA comparison's lr comes from the committed probe, not a
    guess; a probe that picks another lr fails this test until the recipes follow it."""
    rows = lr_probe.read_csv(FIGURES / dcmha.LR_PROBE_CSV)
    assert {r["recipe"] for r in rows} == {f"dcmha-conjunction-full-{v}-s0"
                                           for v in ("dcmha", "mha")}
    assert len({r["lr"] for r in rows}) >= 3 and max(r["step"] for r in rows) >= 2000
    best = lr_probe.best_lrs(rows)
    for name, recipe in dcmha.RECIPES.items():
        if recipe.phenomenon == "dcmha-conjunction-full":
            assert recipe.train["lr"] == best[recipe.variant], name
    text = dcmha_report._probe_text("dcmha-conjunction-full")
    assert "(chosen)" in text and "lowest validation loss at the last step" in text


def test_twin_plateau_reading_follows_the_probe(tmp_path, monkeypatch):
    """The -twin section says whether 20,000 steps without early stopping leave the tie."""
    from attnlens.reports.reproduction import page as report

    text = dcmha_report._probe_text("dcmha-conjunction-twin")
    rows = lr_probe.read_csv(FIGURES / dcmha.TWIN_PROBE_CSV)
    assert max(r["step"] for r in rows) == 20_000 and {r["variant"] for r in rows} == {
        "dcmha", "mha"}
    assert ("no late phase change" in text) == all(
        r["val_loss"] > 1.0 for r in rows if r["step"] > 5000)
    fake = [dict(r, val_loss=0.3 if r["step"] > 15000 else r["val_loss"]) for r in rows]
    lr_probe.write_csv(fake, tmp_path / dcmha.TWIN_PROBE_CSV)
    monkeypatch.setattr(report, "FIGURES", tmp_path)
    assert "a late phase change that early stopping cut off" in dcmha_report._probe_text(
        "dcmha-conjunction-twin")
