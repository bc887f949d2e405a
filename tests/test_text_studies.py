"""The text-zoo studies and the generated docs/zoo.md, on `--smoke` releases of every variant
(tiny, 4 training steps: the numbers mean nothing, the pipeline is what is checked)."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest
from tiers import documented

from attnlens.cli import main as cli_main
from attnlens.interp.tools.heads import induction_tables
from attnlens.interp.tools.text_eval import PROBE_HALF, PROBE_SEED, distribution_stage
from attnlens.interp.variants.cope import token_category
from attnlens.lab.text_studies import (
    COPY_RATIO_THRESHOLD,
    INDUCTION_THRESHOLD,
    STUDY_TABLES,
    _load,
    induction_study,
    released_models,
    run_studies,
    training_logs,
)
from attnlens.reports import calibration_docs, zoo_docs

NAMES = ["text-mha-l1", "text-mha-l2", "text-mta-l2", "text-cope-l2", "text-dcmha-l2",
         "text-infini-l2", "text-mha-l2-s1"]                 # and a seed replicate


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    out = tmp_path_factory.mktemp("zoo")
    assert cli_main(["train", "--zoo", "text", "--smoke", "--only", *NAMES, "--out", str(out),
                     "--device", "cpu", "--no-progress"]) == 0
    return out / "release"


@pytest.fixture(scope="module")
def studies(release, tmp_path_factory):
    out = tmp_path_factory.mktemp("studies")
    return out, run_studies(release, out, png=False, progress=False)


def test_studies_of_some_models_replace_their_rows_as_a_full_run_writes_them(release, studies,
                                                                            tmp_path):
    full_dir, _ = studies
    part = tmp_path / "part"
    shutil.copytree(full_dir, part)
    redo = ["text-infini-l2", "text-mha-l2"]
    stale = pd.read_csv(part / "induction.csv")
    stale.loc[stale.model.isin(redo), "induction_score"] = 99.0     # rows that must be replaced
    stale.to_csv(part / "induction.csv", index=False)
    run_studies(release, part, png=False, progress=False, only=redo)
    for key in STUDY_TABLES:
        if (full_dir / f"{key}.csv").is_file():
            pd.testing.assert_frame_equal(pd.read_csv(part / f"{key}.csv"),
                                          pd.read_csv(full_dir / f"{key}.csv"), obj=key)
    with pytest.raises(ValueError, match="text-mha-l7"):
        run_studies(release, part, png=False, progress=False, only=["text-mha-l7"])


def test_released_models_are_found_by_name_and_card(release, tmp_path):
    assert list(released_models(release)) == sorted(NAMES)
    (release / "text-mha-l9").mkdir()                      # no card: ignored
    assert "text-mha-l9" not in released_models(release)
    with pytest.raises(ValueError, match="does not exist"):
        released_models(tmp_path / "nope")
    with pytest.raises(ValueError, match="no released text model"):
        run_studies(tmp_path, tmp_path / "out", png=False, progress=False)


def test_induction_study_reads_the_cards_and_logs(release, studies):
    models = released_models(release)
    table = induction_study(models)
    assert list(table["model"]) == sorted(NAMES)
    measured = 0
    for _, row in table.iterrows():
        card = json.loads((release / row["model"] / "card.json").read_text())["metrics"]
        assert row["induction_score"] == card["induction_score"]
        assert row["forms_induction"] == (card["induction_score"] >= INDUCTION_THRESHOLD
                                          and card["copy_loss_ratio"] < COPY_RATIO_THRESHOLD)
        best = max(card["head_table"], key=lambda h: h["induction_stripe"])
        assert row["best_head"] == best["label"]
        model = _load(release / row["model"])
        stage = distribution_stage(model)
        if stage is None:
            assert pd.isna(row["distribution_head"]) and pd.isna(row["distribution_stage"])
            continue
        # the row-stochastic stage's best head, re-measured on the card's probe
        measured += 1
        assert row["distribution_stage"] == stage
        half = min(PROBE_HALF, (model.cfg.n_ctx - 1) // 2)
        heads = induction_tables(model, [stage], batch=8, half_len=half, seed=PROBE_SEED)[stage]
        assert row["distribution_head"] == heads["induction_stripe"].idxmax()
        assert card[f"induction_score_{stage}"] == pytest.approx(
            heads["induction_stripe"].max(), abs=1e-4)
    assert measured == 3                                   # MTA, DCMHA and Infini
    log = training_logs(models)
    assert set(log["model"]) == set(NAMES)
    steps = log.groupby("model")["step"].apply(list).to_dict()
    assert steps == {n: [2, 4] for n in NAMES}            # eval_every=2 of 4 smoke steps
    for _, g in log.groupby("model"):
        assert g["tokens"].is_monotonic_increasing and g["tokens"].iloc[0] > 0


def test_diversity_and_gating_tables_cover_every_variant(release, studies):
    out, tables = studies
    summary = tables["diversity"]
    assert set(summary["variant"]) == {"mha", "mta", "cope", "dcmha", "infini"}
    assert set(summary[summary["composed"]]["variant"]) == {"mta", "dcmha"}
    assert summary["mean_captured"].between(0, 1 + 1e-9).all()
    assert {"infini_memory", "mta_gates", "mta_kernels", "dcmha_dynamic",
            "cope_categories"} <= set(tables)
    assert set(tables["infini_memory"]["class"]) <= {"memory specialist", "local specialist",
                                                     "mixer", "intermediate"}
    cope = tables["cope_categories"]
    assert cope["mean_gate"].between(0, 1).all() and (cope["count"] > 0).all()
    # every key but BOS (which leads each window and separates files), once per head
    from attnlens.interp.tools.text_eval import load_eval_tokens
    from attnlens.lab.text_studies import STUDY_WINDOWS

    windows = load_eval_tokens(release / "text-cope-l2")[:STUDY_WINDOWS]
    per_head = cope.groupby("head_label")["count"].sum()
    assert (per_head == int((windows != 0).sum())).all() and (windows[:, 0] == 0).all()
    for name in ("induction", "training_log", "diversity", "cope_categories", "copy_distance"):
        assert (out / f"{name}.csv").is_file()
    for fig in ("phase_change", "diversity", "cope_categories", "copy_distance"):
        assert (out / f"{fig}.html").is_file()


def test_copy_distance_study_is_the_probe_at_each_distance(release, studies):
    """Each row is `induction_probe` at that half length (recomputed here); distances that do
    not fit n_ctx are left out; only Infini rows carry a segment length."""
    import math

    from attnlens.hooked_models.model import HookedVariantTransformer
    from attnlens.interp.tools.text_eval import induction_probe
    from attnlens.lab.text_studies import COPY_DISTANCES

    _, tables = studies
    table = tables["copy_distance"]
    assert set(table["model"]) == set(NAMES)
    for name, g in table.groupby("model"):
        model = HookedVariantTransformer.from_pretrained(release / name, device="cpu").float()
        fits = [d for d in COPY_DISTANCES if 2 * d + 1 <= model.cfg.n_ctx]
        assert list(g["distance"]) == fits and fits
        row = g.iloc[0]
        probe = induction_probe(model, half=int(row["distance"]))
        assert row["induction_score"] == pytest.approx(probe["induction_score"], abs=1e-6)
        assert row["copy_loss_ratio"] == pytest.approx(probe["copy_loss_ratio"], rel=1e-5)
        assert math.isnan(row["segment_len"]) == (not name.startswith("text-infini"))


def test_copy_distance_findings_tell_local_from_memory_copying():
    import pandas as pd

    rows = [("text-infini-l2", "infini", "l2", d, s, r, 128.0)
            for d, s, r in ((20, 0.4, 0.7), (100, 0.03, 0.97), (150, 0.003, 0.99))]
    rows += [("text-mha-l2", "mha", "l2", 20, 0.57, 0.56, float("nan"))]
    table = pd.DataFrame(rows, columns=["model", "variant", "shape", "distance",
                                        "induction_score", "copy_loss_ratio", "segment_len"])
    text = zoo_docs.copy_distance_findings(table)
    assert "| `text-mha-l2` | 0.57 / 0.56 | - | - |" in text
    assert "inside a segment its best score is 0.40 at |r| = 20" in text
    assert ("the score is at most 0.003 and the loss ratio at least 0.99: an induction head in "
            "local attention, and no copying through the memory.") in text
    assert "text-mha-l2** (" not in text          # no segment: no local-vs-memory line
    assert "**text-mha-l2**: its induction head reaches across the context" in text
    weak = table.assign(induction_score=table.induction_score / 10,
                        copy_loss_ratio=table.copy_loss_ratio - 0.1)
    text = zoo_docs.copy_distance_findings(weak)
    assert "no induction head in local attention, and copying through the memory." in text
    assert "reaches across" not in text


def test_token_categories():
    assert token_category("\n    ") == "newline"
    assert token_category("    ") == "indentation"
    assert token_category(" foo") == "identifier"
    assert token_category(" def") == "keyword-like"
    assert token_category("42") == "number"
    assert token_category("):") == "punctuation"
    assert token_category("'x y") == "string/other"


def test_zoo_docs_from_a_shipped_text_zoo(release, studies, tmp_path):
    out, _ = studies
    zoo = tmp_path / "zoo"
    shutil.copytree(zoo_docs.DEFAULTS["zoo"] / "induction-mha", zoo / "induction-mha")
    for name in NAMES:
        shutil.copytree(release / name, zoo / name)
    text = zoo_docs.render(zoo, out, tmp_path / "zoo.md")
    assert "blocked on GPU time" not in text and f"{len(NAMES)} text language models" in text
    for name in NAMES:
        assert f"| `{name}` |" in text
    assert "### Induction heads across variants" in text and "**cope**" in text
    assert "### Head diversity" in text and "dcmha composed QK" in text
    assert "text-infini-l2: gate classes" in text
    assert "text-cope-l2: mean gate by the key's token category" in text
    assert "### Where attention gets its sharpness" in text and "`composed_scores`" in text
    seeds = text.split("### Seeds", 1)[1].split("###", 1)[0]
    assert "- **text-mha-l2**, training seeds 0, 1: an induction head in" in seeds
    assert "t-interval" in seeds and "text-dcmha-l2**" not in seeds      # no DCMHA replicate
    from attnlens.lab.text_recipes import RECIPES
    status = text.split("Status: ", 1)[1].split("\n", 1)[0]
    missing = [n for n in RECIPES if n not in NAMES]
    verb = "is" if len(missing) == 1 else "are"
    assert f"{len(missing)} of the zoo's {len(RECIPES)} recipes {verb} not shipped yet" in status
    assert all(f"`{n}`" in status for n in missing)
    assert not any(f"`{n}`" in status for n in NAMES)


def test_a_release_of_an_older_recipe_counts_as_not_shipped(release, tmp_path):
    zoo = tmp_path / "zoo"
    shutil.copytree(release / NAMES[1], zoo / NAMES[1])
    card_path = zoo / NAMES[1] / "card.json"
    card = json.loads(card_path.read_text())
    assert f"`{NAMES[1]}`" not in zoo_docs.unshipped_text(zoo)
    card.pop("smoke_test_only", None)
    card["train_config"] = {**card["train_config"], "steps": 1}
    card_path.write_text(json.dumps(card))
    assert f"`{NAMES[1]}`" in zoo_docs.unshipped_text(zoo)


def test_sharpness_study_has_every_head_of_every_model(release, studies):
    _, tables = studies
    spread = tables["score_spread"]
    assert set(spread["model"]) == set(NAMES)
    for name, g in spread.groupby("model"):
        cfg = json.loads((release / name / "config.json").read_text())
        assert len(g) == len(set(g.head_label)) == cfg["n_layers"] * cfg["n_heads"], name
    measured = spread[spread["rows"] > 0]      # the smoke Infini's segments are < 32 keys
    assert measured.model.nunique() >= 5 and spread[spread["rows"] == 0].raw_std.isna().all()
    assert (measured["raw_std"] > 0).all() and measured["max_weight"].between(0, 1).all()
    mha = spread[spread.variant == "mha"]
    assert (mha.raw_std == mha.logit_std).all()


def test_sharpness_section_names_the_stage_that_widens_the_spread():
    import pandas as pd

    from attnlens.reports.sharpness_docs import sharpness_section

    rows = [dict(model=m, layer=0, head=h, logit_stage=st, raw_std=raw, logit_std=lg,
                 entropy=2.0, max_weight=0.4)
            for m, st, raw, lg in [("a", "composed_scores", 0.5, 1.5), ("b", "attn_scores", 2, 2)]
            for h in range(2)]
    text = sharpness_section(pd.DataFrame(rows))
    assert "`a` layer 0: `composed_scores` widens the q.k spread 3.0x (0.50 -> 1.50)." in text
    assert "`b` layer 0" not in text          # ratio 1: no finding
    assert "ranges from 0.50 (`a`) to 2.00 (`b`)" in text


@documented("study")   # the fast tier's representative study re-derivation
def test_shipped_sharpness_table_is_recomputed():
    """docs/figures/zoo/score_spread.csv's rows of one shipped model, recomputed."""
    import pandas as pd

    from attnlens.lab.text_studies import sharpness_study

    name = "text-dcmha-l2"
    doc = pd.read_csv(zoo_docs.DEFAULTS["studies"] / "score_spread.csv")
    doc = doc[doc.model == name].reset_index(drop=True)
    got = sharpness_study({name: zoo_docs.DEFAULTS["zoo"] / name})
    assert list(got.head_label) == list(doc.head_label)
    for col in ("raw_std", "logit_std", "entropy", "max_weight"):
        assert got[col].to_numpy() == pytest.approx(doc[col].to_numpy(), abs=1e-3), col


@documented("report")
def test_docs_zoo_md_is_current():
    assert zoo_docs.main(["--check"]) == 0, \
        "docs/zoo.md is stale: run `python -m attnlens.reports.zoo_docs`"


def test_model_names_cover_the_data_mix_twins_but_not_calibration_runs():
    from attnlens.lab.text_studies import _parts

    assert _parts("text-mha-l2-mix") == ("mha", "l2-mix")
    assert _parts("text-dcmha-l2-pkgs") == ("dcmha", "l2-pkgs")
    assert _parts("text-infini-l4mlp") == ("infini", "l4mlp")
    assert _parts("text-mha-l2-s2") == ("mha", "l2-s2")
    with pytest.raises(ValueError, match="not a text-zoo model name"):
        _parts("text-mha-l2-ctx256")


def test_mta_calibration_text_reads_the_crossing_and_the_peak():
    import pandas as pd

    traj = pd.DataFrame({"run": ["text-mta-l2"] * 3, "step": [250, 500, 750],
                         "tokens": [1e6, 2e6, 3e6], "val_loss": [4.0, 3.0, 2.7],
                         "induction_score": [0.2, 1.04, 0.9],
                         "copy_loss_ratio": [0.96, 0.49, 0.34],
                         "text_copy_ratio": [0.92, 0.42, 0.32]})
    text = calibration_docs.mta_calibration_text(traj)
    assert "from 0.96x the first at 1.0M tokens to 0.49x at 2.0M" in text
    assert "0.92 to 0.42" in text and "ended at 0.34x" in text
    assert "peaked at 1.04 at 2.0M tokens and drifted to 0.90" in text
    assert calibration_docs.mta_calibration_text(traj.assign(copy_loss_ratio=0.9)) is None
    assert calibration_docs.mta_calibration_text(traj.assign(run="other")) is None


def test_corpus_calibration_text_compares_each_pkgs_run_with_its_twin_at_equal_tokens():
    import pandas as pd

    def log(run, tokens, score, ratio, text, val):
        return pd.DataFrame({"run": run, "step": range(1, len(tokens) + 1), "tokens": tokens,
                             "val_loss": val, "induction_score": score,
                             "copy_loss_ratio": ratio, "text_copy_ratio": text})

    twin = log("text-dcmha-l2", [1e6, 2e6, 3e6], [0.01, 0.02, 0.5], [0.99, 0.98, 0.3],
               [0.97, 0.96, 0.2], [4.0, 3.5, 3.0])
    pkgs = log("text-dcmha-l2-pkgs", [1e6, 2e6], [0.01, 0.4], [0.99, 0.45],
               [0.98, 0.5], [4.2, 3.7])
    text = calibration_docs.corpus_calibration_text(pd.concat([twin, pkgs]))
    assert ("`text-dcmha-l2-pkgs` against `text-dcmha-l2` over their first 2.0M tokens (where "
            "the `-pkgs` run stood when this page was written): best "
            "induction score 0.400 against 0.020, lowest copy ratio 0.45 / 0.50 against "
            "0.98 / 0.96 (random / text), an induction score of 0.3 first at 2.0M tokens "
            "against none, bar met at 2.0M tokens against not met, "
            "validation loss 3.700 against 3.500") in text
    assert calibration_docs.corpus_calibration_text(twin) is None
    assert "standard library is" not in text
    assert "(Corpus above; the standard library is 8% of that stream)" in \
        calibration_docs.corpus_calibration_text(pd.concat([twin, pkgs]), 0.0767)
    done = calibration_docs.corpus_calibration_text(pd.concat([twin[twin.tokens <= 2e6], pkgs]))
    assert "over their first 2.0M tokens: best" in done   # both finished: nothing partial


def test_the_corpus_reading_names_who_formed_a_head_only_on_the_larger_corpus():
    reading = calibration_docs._corpus_reading
    assert reading({"dcmha": (37.9e6, None), "mha": (25.6e6, 24.6e6)}) == (
        " Read together, one seed each: dcmha formed an induction head only on the larger "
        "corpus, while mha formed one on both at about the same point (mha: 25.6M tokens "
        "against 24.6M tokens): the larger corpus, at the same tokens, is what dcmha lacked.")
    far = reading({"dcmha": (37.9e6, None), "mha": (10e6, 24.6e6)})
    assert "about the same point" not in far and "mha: 10.0M tokens against 24.6M" in far
    assert reading({"dcmha": (None, None), "mha": (25.6e6, 24.6e6)}) == ""   # nothing to contrast
    assert reading({"dcmha": (37.9e6, None)}) == ""


def test_one_layer_findings_name_a_copying_control_and_its_kernel():
    """A clean 1-layer control gets no line; one that copies is named, and an MTA control whose
    best head has an induction-class pre-softmax kernel gets the mechanism with its share."""
    table = pd.DataFrame([
        dict(model="text-mha-l1", shape="l1", forms_induction=False, has_induction_head=False,
             copy_loss_ratio=1.0, best_head="L0H1"),
        dict(model="text-mha-l2", shape="l2", forms_induction=True, has_induction_head=True,
             copy_loss_ratio=0.4, best_head="L1H0")])
    assert zoo_docs.one_layer_findings(table, None) == ""
    table.loc[len(table)] = dict(model="text-mta-l1", shape="l1", forms_induction=True,
                                 has_induction_head=True, copy_loss_ratio=0.25, best_head="L0H1")
    plain = zoo_docs.one_layer_findings(table, None)
    assert "`text-mta-l1` copies" in plain and "0.25x" in plain and "kernel" not in plain
    kernels = pd.DataFrame([
        dict(model="text-mta-l1", head_label="L0H1", phase="post", **{"class": "induction"},
             induction_share=0.5),
        dict(model="text-mta-l1", head_label="L0H1", phase="pre", **{"class": "induction"},
             induction_share=0.983)])
    text = zoo_docs.one_layer_findings(table, kernels)
    assert "98% of its energy" in text and "text-mha" not in text
    kernels.loc[1, "class"] = "mixed"
    assert "kernel" not in zoo_docs.one_layer_findings(table, kernels)


def test_stdlib_share_is_read_from_a_pkgs_card(tmp_path):
    """The `-pkgs` paragraph's standard-library share comes from the card, not from the page."""
    assert calibration_docs.stdlib_share(tmp_path) is None
    (tmp_path / "text-mha-l2-pkgs").mkdir()
    card = {"extra_corpus": {"stdlib_train_tokens": 8_865_194, "tokens": 115_554_611}}
    (tmp_path / "text-mha-l2-pkgs" / "card.json").write_text(json.dumps(card))
    share = calibration_docs.stdlib_share(tmp_path)
    assert share == pytest.approx(0.0767, abs=1e-4)
    shipped = calibration_docs.stdlib_share(zoo_docs.DEFAULTS["zoo"])
    assert shipped is None or 0 < shipped < 1


@pytest.mark.parametrize("n_models", [3, 18, 40])
def test_training_figures_are_tall_enough_to_name_every_model(n_models):
    """The copy-distance figure was 620 px whatever the zoo held: with 17 models its legend
    was cut off after 15 and the last two models went unnamed. Both text-zoo figures grow
    with the number of models so every legend entry fits."""
    from attnlens.interp.plots.training import (
        LEGEND_ROW_PX,
        copy_distance_figure,
        legend_height,
        phase_change_figure,
    )

    rows = [dict(model=f"text-mha-m{i:02d}", variant="mha", shape="l2", distance=d, tokens=d,
                 induction_score=0.1, copy_loss_ratio=0.9, val_loss=3.0, segment_len=None)
            for i in range(n_models) for d in (20, 50)]
    table = pd.DataFrame(rows)
    for fig in (copy_distance_figure(table), phase_change_figure(table)):
        named = [t.name for t in fig.data if t.showlegend]
        assert len(named) == n_models
        assert fig.layout.height >= legend_height(n_models) >= LEGEND_ROW_PX * n_models
