"""DCMHA vs MHA on text (issue 24 item 3): the comparison's recipes, its evaluation against a
naive loss, the CSV round trip, the report section's numbers, and the committed CSV's zoo rows
recomputed from the shipped weights."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from tiers import documented

from attnlens.cli import main as cli_main
from attnlens.hooked_models.model import HookedVariantTransformer
from attnlens.interp.tools.text_eval import load_eval_tokens
from attnlens.lab import text_compare
from attnlens.lab.text_recipes import COMPARISON_RECIPES, RECIPES, get_recipe, run_seed
from attnlens.reports.reproduction import dcmha_text
from attnlens.reports.reproduction.page import FIGURES, welch_interval

ZOO = Path(__file__).resolve().parents[1] / "hooked_models" / "zoo"


def test_comparison_recipes_are_the_l2_recipes_with_their_own_seeds():
    assert sorted(COMPARISON_RECIPES) == sorted(text_compare.SHORT)
    for name, recipe in COMPARISON_RECIPES.items():
        base = RECIPES[f"text-{recipe.variant}-l2"]
        assert (recipe.shape, recipe.data_mix) == (base.shape, base.data_mix)
        assert run_seed(name, seed=7) == int(name[-1])
        assert recipe.train_overrides["steps"] * 16 * 256 == 10_240_000   # 10M tokens
    assert run_seed("text-mha-l2", seed=7) == 7            # no own seed: the command's
    with pytest.raises(ValueError, match="unknown text recipe"):
        get_recipe("text-mha-l2-short-s9")


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """Smoke releases (4 steps, tiny shapes) of the comparison's 8 models."""
    out = tmp_path_factory.mktemp("cmp")
    names = [*text_compare.SHORT, *text_compare.FULL]
    assert cli_main(["train", "--zoo", "text", "--smoke", "--only", *names, "--out", str(out),
                     "--device", "cpu", "--no-progress"]) == 0
    return out / "release"


def test_short_runs_train_with_their_own_seed(release):
    cards = {n: json.loads((release / n / "card.json").read_text()) for n in text_compare.SHORT}
    assert {n: c["seed"] for n, c in cards.items()} == {n: int(n[-1]) for n in cards}
    a = HookedVariantTransformer.from_pretrained(release / "text-mha-l2-short-s0")
    b = HookedVariantTransformer.from_pretrained(release / "text-mha-l2-short-s1")
    assert not torch.equal(a.W_E, b.W_E)


@torch.no_grad()
def naive_window_loss(model, window: torch.Tensor) -> float:
    """Mean next-token cross-entropy of one window, from the logits, position by position."""
    logits = model(window[None], return_type="logits")[0].double()
    total = 0.0
    for pos in range(window.shape[0] - 1):
        total -= float(F.log_softmax(logits[pos], -1)[window[pos + 1]])
    return total / (window.shape[0] - 1)


def test_window_losses_match_a_naive_cross_entropy(release):
    model = HookedVariantTransformer.from_pretrained(release / "text-dcmha-l2-short-s0")
    windows = load_eval_tokens(release / "text-dcmha-l2-short-s0")[:5]
    got = text_compare.window_losses(model, windows, batch=2)
    want = [naive_window_loss(model, w) for w in windows]
    assert got.shape == (5,)
    assert got.tolist() == pytest.approx(want, abs=1e-5)


def test_rows_curves_and_csv_round_trip(release, tmp_path):
    models = text_compare.find_models(release, release)
    windows = load_eval_tokens(models["text-mha-l2"])
    short = models["text-dcmha-l2-short-s1"]
    rows = text_compare.model_rows("text-dcmha-l2-short-s1", short, windows,
                                   text_compare.read_card(short))
    assert [(r["compose"], r["seed"], r["variant"]) for r in rows] == [("on", 1, "dcmha"),
                                                                       ("off", 1, "dcmha")]
    assert rows[0]["ctx"] == 64                           # the smoke curriculum ends at n_ctx
    model = HookedVariantTransformer.from_pretrained(models["text-dcmha-l2-short-s1"])
    assert rows[0]["val_loss"] == pytest.approx(
        float(text_compare.window_losses(model, windows).mean()), abs=1e-4)
    assert rows[1]["val_loss"] != rows[0]["val_loss"]     # the knock-out changes the model
    mha = models["text-mha-l2"]
    mha_rows = text_compare.model_rows("text-mha-l2", mha, windows, text_compare.read_card(mha))
    assert [r["compose"] for r in mha_rows] == ["on"]     # no Compose to knock out
    curves = text_compare.curve_rows("text-mha-l2", mha, text_compare.read_card(mha))
    assert [c["step"] for c in curves] == [2, 4]
    text_compare.write_csv(rows, tmp_path / "r.csv")
    assert text_compare.read_csv(tmp_path / "r.csv") == rows
    assert text_compare.losses(rows, "dcmha", "short", compose="off", ctx=64) == [
        rows[1]["val_loss"]]


def test_missing_models_are_named(release, tmp_path):
    with pytest.raises(FileNotFoundError, match="text-dcmha-l2 "):
        text_compare.find_models(release, tmp_path)
    with pytest.raises(FileNotFoundError, match="text-dcmha-l2 "):   # partial: not the zoo's
        text_compare.find_models(release, tmp_path, partial=True)
    short = tmp_path / "short"
    for name in ("text-mha-l2-short-s0", "text-dcmha-l2-short-s1"):
        (short / name).mkdir(parents=True)
        (short / name / "card.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="text-mha-l2-short-s1 "):
        text_compare.find_models(short, release)
    found = text_compare.find_models(short, release, partial=True)
    assert sorted(found) == sorted(["text-mha-l2-short-s0", "text-dcmha-l2-short-s1",
                                    *text_compare.FULL])
    (short / "text-dcmha-l2-short-s1" / "card.json").unlink()      # no DCMHA seed left
    with pytest.raises(FileNotFoundError, match="text-dcmha-l2-short-s0 "):
        text_compare.find_models(short, release, partial=True)


def test_trained_ctx_reads_the_curriculum():
    class Cfg:
        n_ctx = 512

    class Model:
        cfg = Cfg()

    schedule = [[6250, 256]]
    assert text_compare.trained_ctx({"steps": 2500, "ctx_schedule": schedule}, Model()) == 256
    assert text_compare.trained_ctx({"steps": 6250, "ctx_schedule": schedule}, Model()) == 256
    assert text_compare.trained_ctx({"steps": 10_000, "ctx_schedule": schedule}, Model()) == 512
    assert text_compare.trained_ctx({"steps": 10}, Model()) == 512


def synthetic_rows(mha, dc, off) -> list[dict]:
    rows = []
    for variant, values in (("mha", mha), ("dcmha", dc)):
        for seed, v in enumerate(values):
            rows.append({"model": f"text-{variant}-l2-short-s{seed}", "variant": variant,
                         "seed": seed, "steps": 2500, "tokens": 10_240_000,
                         "parameters": 1_185_536 if variant == "mha" else 1_208_064, "ctx": 256,
                         "compose": "on", "val_loss": v, "cpu_time_s": 1000.0})
    for seed, v in enumerate(off):
        rows.append({**rows[len(mha) + seed], "compose": "off", "val_loss": v})
    return rows


def test_section_numbers_follow_the_rows():
    rows = synthetic_rows([3.30, 3.31, 3.32], [3.20, 3.22, 3.21], [3.60, 3.58, 3.62])
    text = " ".join(dcmha_text.compare_text(rows))
    d, lo, hi = welch_interval([3.30, 3.31, 3.32], [3.20, 3.22, 3.21])
    assert f"MHA - DCMHA = {d:+.3f} nats (Welch 95% interval {lo:+.3f} to {hi:+.3f})" in text
    assert "DCMHA's loss is lower" in text and lo > 0
    assert "raises its loss by 0.390" in text
    assert "direction of the paper's claim holds" in dcmha_text.reading(rows)
    assert "DCMHA +1.9%" in dcmha_text.reading(rows)
    worse = synthetic_rows([3.20, 3.21, 3.22], [3.30, 3.31, 3.32], [])
    assert "does not reproduce" in dcmha_text.reading(worse)
    assert "MHA's loss is lower" in " ".join(dcmha_text.compare_text(worse))
    tied = synthetic_rows([3.20, 3.30, 3.25], [3.21, 3.31, 3.24], [])
    assert "neither reproduced nor contradicted" in dcmha_text.reading(tied)
    assert dcmha_text.reading(synthetic_rows([3.2], [3.3], [])) == "Too few seeds for a reading."
    assert dcmha_text._seeds(rows) == "Three seeds of each variant"
    # the zoo's pair at 41M tokens: the same order, or reversed beyond the seed scale
    full = [{**rows[0], "model": f"text-{v}-l2", "variant": v, "ctx": 512, "val_loss": loss,
             "tokens": 40_960_000} for v, loss in (("mha", 2.86), ("dcmha", 3.13))]
    text = dcmha_text.reading(rows + full, {"mha": 0.37, "dcmha": 0.001})
    assert "reverses the order: MHA - DCMHA = -0.270 nats" in text
    assert "MHA formed an induction head where DCMHA did not" in text
    assert "does not last" in text
    same = [{**f, "val_loss": v} for f, v in zip(full, (3.0, 2.9), strict=True)]
    assert "reverses" not in dcmha_text.reading(rows + same)
    assert "gives MHA - DCMHA = +0.100 nats" in dcmha_text.reading(rows + same)
    assert dcmha_text._seeds(synthetic_rows([3.2, 3.3], [3.3], [])) == (
        "2 seed(s) of MHA and 1 of DCMHA")


def test_the_package_corpus_pair_is_its_own_group():
    rows = synthetic_rows([3.30, 3.31, 3.32], [3.20, 3.22, 3.21], [])
    pkgs = [{**rows[0], "model": f"text-{v}-l2-pkgs", "variant": v, "ctx": 512, "val_loss": loss,
             "tokens": 40_960_000} for v, loss in (("mha", 3.25), ("dcmha", 3.36))]
    assert [text_compare.group(r["model"]) for r in pkgs] == ["pkgs", "pkgs"]
    assert text_compare.group("text-mha-l2") == "full"
    # the pair's rows never enter the short runs' seeds or the zoo pair's
    assert text_compare.losses(rows + pkgs, "mha", "short") == [3.30, 3.31, 3.32]
    assert text_compare.losses(rows + pkgs, "mha", "full", ctx=512) == []
    assert text_compare.losses(rows + pkgs, "dcmha", "pkgs", ctx=512) == [3.36]
    with pytest.raises(ValueError, match="group 'long'"):
        text_compare.losses(rows, "mha", "long")
    text = " ".join(dcmha_text.compare_text(rows + pkgs))
    assert "at context 512: MHA 3.250, DCMHA 3.360 (MHA - DCMHA = -0.110 nats)" in text
    half = dcmha_text.ShortRuns.of(rows).half
    read = dcmha_text.reading(rows + pkgs, pkgs_induction={"mha": 0.5, "dcmha": 0.42})
    assert "MHA - DCMHA = -0.110 nats at context 512" in read
    assert ("beyond" if 0.110 > half else "within") + " the 10M-token runs' seed scale" in read
    assert "best induction score MHA 0.500, DCMHA 0.420" in read
    assert "ten times the text" not in dcmha_text.reading(rows)


def test_a_lone_package_corpus_model_is_left_out(release, tmp_path, capsys):
    zoo = tmp_path / "zoo"
    for name in (*text_compare.FULL, "text-dcmha-l2-pkgs"):
        (zoo / name).mkdir(parents=True)
        (zoo / name / "card.json").write_text("{}")
    found = text_compare.find_models(release, zoo)
    assert "text-dcmha-l2-pkgs" not in found
    assert "its twin of the package-corpus pair is not shipped" in capsys.readouterr().err
    (zoo / "text-mha-l2-pkgs").mkdir()
    (zoo / "text-mha-l2-pkgs" / "card.json").write_text("{}")
    assert set(text_compare.PKGS) <= set(text_compare.find_models(release, zoo))


COMMITTED = FIGURES / dcmha_text.CSV


@pytest.mark.skipif(not COMMITTED.is_file() or not (ZOO / "text-dcmha-l2").is_dir(),
                    reason="the comparison's CSV or text-dcmha-l2 is not shipped yet")
@pytest.mark.reproduce
@documented("study")
def test_committed_rows_of_the_zoo_models_recompute():
    rows = text_compare.read_csv(COMMITTED)
    names = {r["model"] for r in rows}       # every zoo model; the short runs released
    assert set(text_compare.FULL) <= names <= {*text_compare.SHORT, *text_compare.FULL,
                                               *text_compare.PKGS}
    windows = load_eval_tokens(ZOO / text_compare.WINDOWS_FROM)
    for name in [*text_compare.FULL, *sorted(names & set(text_compare.PKGS))]:
        fresh = text_compare.model_rows(name, ZOO / name, windows,
                                        text_compare.read_card(ZOO / name))
        mine = [r for r in rows if r["model"] == name]
        assert [(r["ctx"], r["compose"]) for r in fresh] == [(r["ctx"], r["compose"])
                                                              for r in mine]
        for a, b in zip(fresh, mine, strict=True):
            assert math.isclose(a["val_loss"], b["val_loss"], abs_tol=2e-4), (name, a, b)
            assert (a["tokens"], a["parameters"]) == (b["tokens"], b["parameters"])
