"""`attnlens sweep` in-process: spec validation, sharding exactness, resume, files, CLI.

Exactness: with float64 models, a head's summarised score over shards (weighted by prompts)
equals the analysis run on all prompts at once, whatever the shard size.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch
import yaml

from attnlens.cli import main as cli_main
from attnlens.interp.sweep import run_sweep
from attnlens.interp.sweep.prompts import make_prompts
from attnlens.interp.sweep.shards import plan
from attnlens.interp.sweep.spec import load_spec, parse_spec
from attnlens.interp.tasks.induction import repeated_tokens
from attnlens.interp.tools import gating, heads

from helpers import EXACT, tiny_model

HALF = 5


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    """Two float64 checkpoints (MHA with a tokenizer, MTA with gates) in one folder."""
    root = tmp_path_factory.mktemp("ckpts")
    tiny_model("mha", dtype="float64", tokenizer_alphabet="abcdefgh").save_pretrained(root / "mha")
    tiny_model("mta", dtype="float64").save_pretrained(root / "mta")
    (root / "lines.txt").write_text("abcabc\nabab\n\nhgfhgf\nab\nbcdbcd\n")
    return root


def base_spec(ckpts, **over) -> dict:
    spec = {"models": [str(ckpts / "mha"), {"path": str(ckpts / "mta"), "name": "mta"}],
            "prompts": [{"name": "rep", "task": "induction", "count": 7, "seed": 3,
                         "args": {"half_len": HALF}}],
            "analyses": ["heads", "gates"], "shard_size": 3}
    spec.update(over)
    return spec


def model_of(path):
    from attnlens.hooked_models import HookedVariantTransformer

    return HookedVariantTransformer.from_pretrained(path)


@pytest.mark.parametrize("change, field", [
    ({"models": []}, "models"),
    ({"models": ["no-such-model"]}, "models[0].source"),
    ({"models": [{"path": "missing-dir"}]}, "models[0].path"),
    ({"models": [{"zoo": "induction-mha", "dtype": "float8"}]}, "models[0].dtype"),
    ({"models": [{"zoo": "induction-mha", "colour": 1}]}, "models[0]"),
    ({"prompts": [{"task": "induction"}]}, "prompts[0].count"),
    ({"prompts": [{"task": "induction", "count": 0}]}, "prompts[0].count"),
    ({"prompts": [{"task": "nosuch", "count": 2}]}, "prompts[0].task"),
    ({"prompts": [{"task": "induction", "count": 2, "args": {"halflen": 3}}]},
     "prompts[0].args"),
    ({"prompts": [{"file": "nope.txt"}]}, "prompts[0].file"),
    ({"prompts": [{"file": "x.txt", "task": "induction", "count": 1}]}, "prompts[0]"),
    ({"analyses": ["nosuch"]}, "analyses[0].analysis"),
    ({"analyses": [{"analysis": "heads", "args": {"stages": "x"}}]}, "analyses[0].args"),
    ({"analyses": [{"analysis": "heads", "prompts": ["other"]}]}, "analyses[0].prompts"),
    ({"analyses": [{"analysis": "composition", "prompts": ["rep"]}]}, "analyses[0].prompts"),
    ({"analyses": ["heads", "heads"]}, "analyses: names must be unique"),
    ({"shard_size": 0}, "shard_size"),
    ({"device": "tpu"}, "device"),
    ({"colour": "red"}, "spec: unknown field"),
])
def test_bad_specs_name_the_field(ckpts, change, field):
    with pytest.raises(ValueError, match=field.replace("[", r"\[").replace("]", r"\]")):
        parse_spec(base_spec(ckpts, **change), base=ckpts)


def test_yaml_and_json_specs_agree_and_resolve_paths_against_their_folder(ckpts, tmp_path):
    raw = {"models": ["mha", {"zoo": "induction-mha"}],
           "prompts": [{"file": "lines.txt", "count": 3}], "analyses": ["heads"], "out": "run"}
    (ckpts / "s.yaml").write_text(yaml.safe_dump(raw))
    (ckpts / "s.json").write_text(json.dumps(raw))
    a, b = load_spec(ckpts / "s.yaml"), load_spec(ckpts / "s.json")
    assert a == b
    assert a["models"][0]["path"] == str((ckpts / "mha").resolve())
    assert a["prompts"][0]["count"] == 3 and a["out"] == str((ckpts / "run").resolve())
    (tmp_path / "bad.yaml").write_text("models: [unclosed")
    with pytest.raises(ValueError, match="not valid YAML"):
        load_spec(tmp_path / "bad.yaml")


def test_shard_keys_follow_inputs(ckpts):
    shards = plan(parse_spec(base_spec(ckpts), base=ckpts))
    assert len(shards) == 2 * 2 * 3                  # models x analyses x ceil(7 / 3)
    assert len({s["key"] for s in shards}) == len(shards)
    again = plan(parse_spec(base_spec(ckpts), base=ckpts))
    assert [s["key"] for s in again] == [s["key"] for s in shards]
    seeded = base_spec(ckpts)
    seeded["prompts"][0]["seed"] = 4
    assert not {s["key"] for s in plan(parse_spec(seeded, base=ckpts))} & {
        s["key"] for s in shards}


@pytest.mark.parametrize("shard_size", [2, 7])
def test_summary_equals_the_analysis_on_all_prompts(ckpts, tmp_path, shard_size):
    result = run_sweep(base_spec(ckpts, shard_size=shard_size), out=tmp_path, progress=False,
                       figures=False)
    tokens = repeated_tokens(7, HALF, 50, seed=3)
    mha = model_of(ckpts / "mha")
    want = heads.detect_heads(mha, tokens)
    got = result.of("heads", summary=True).query("model == 'mha'").set_index("head_label")
    assert (got["n_prompts"] == 7).all()
    for det in heads.DETECTORS:
        torch.testing.assert_close(torch.tensor(got.loc[want.index, det].to_numpy(float)),
                                   torch.tensor(want[det].to_numpy()), **EXACT)
    mta = model_of(ckpts / "mta")
    gates = gating.gate_values(mta, tokens).set_index(["head_label", "stage"])
    got = result.of("gates", summary=True).set_index(["head_label", "stage"]).loc[gates.index]
    assert len(gates) > 0 and (got["model"] == "mta").all()
    for col in ("mean", "frac_low", "frac_high", "min", "max"):
        torch.testing.assert_close(torch.tensor(got[col].to_numpy(float)),
                                   torch.tensor(gates[col].to_numpy(float)), **EXACT)
    assert (got["signed"].to_numpy(bool) == gates["signed"].to_numpy(bool)).all()


def test_text_prompts_group_by_length(ckpts, tmp_path):
    spec = {"models": [str(ckpts / "mha")], "prompts": [{"name": "t", "file": "lines.txt"}],
            "analyses": ["heads"], "shard_size": 10}
    result = run_sweep(parse_spec(spec, base=ckpts), out=tmp_path, progress=False,
                       figures=False)
    rows = result.of("heads")
    mha = model_of(ckpts / "mha")
    assert sorted(set(rows["seq_len"])) == [3, 5, 7]        # BOS + 2, 4, 6 characters
    assert dict(rows.groupby("seq_len")["n_prompts"].first()) == {3: 1, 5: 1, 7: 3}
    lines = ["abcabc", "abab", "hgfhgf", "ab", "bcdbcd"]
    want = {3: ["ab"], 5: ["abab"], 7: ["abcabc", "hgfhgf", "bcdbcd"]}
    for length, texts in want.items():
        table = heads.detect_heads(mha, mha.to_tokens(texts))
        got = rows[rows["seq_len"] == length].set_index("head_label").loc[table.index]
        torch.testing.assert_close(torch.tensor(got["induction"].to_numpy(float)),
                                   torch.tensor(table["induction"].to_numpy()), **EXACT)
    prompts = make_prompts(mha, load_spec({"models": ["induction-mha"], "prompts": [
        {"file": str(ckpts / "lines.txt")}], "analyses": ["heads"]})["prompts"][0])
    assert [p.numel() - 1 for p in prompts] == [len(x) for x in lines]


def test_rerun_skips_finished_shards_and_repairs_damage(ckpts, tmp_path):
    spec = base_spec(ckpts, analyses=["heads", {"analysis": "composition",
                                                "args": {"n_baseline": 4}}])
    first = run_sweep(spec, out=tmp_path, progress=False, figures=False)
    assert (first.shards, first.ran, first.skipped) == (8, 8, 0)
    assert first.model_loads == [2]                 # each model loaded once in this process
    again = run_sweep(spec, out=tmp_path, progress=False, figures=False)
    assert (again.ran, again.skipped) == (0, 8)
    pd.testing.assert_frame_equal(first.merged, again.merged)
    files = sorted((tmp_path / "shards").glob("*.parquet"))
    files[0].unlink()
    files[1].write_bytes(files[1].read_bytes()[:-10])
    with open(tmp_path / "manifest.jsonl", "a") as f:
        f.write('{"key": "torn')
    repaired = run_sweep(spec, out=tmp_path, progress=False, figures=False)
    assert (repaired.ran, repaired.skipped) == (2, 6)
    pd.testing.assert_frame_equal(first.merged, repaired.merged)
    pd.testing.assert_frame_equal(first.merged, pd.read_parquet(tmp_path / "merged.parquet"))
    changed = run_sweep(base_spec(ckpts, analyses=["heads", {
        "analysis": "composition", "args": {"n_baseline": 5}}]), out=tmp_path, progress=False,
        figures=False)
    assert (changed.ran, changed.skipped) == (2, 6)  # only the composition shards changed


def test_weight_analyses_figures_and_cli(ckpts, tmp_path, capsys):
    spec = base_spec(ckpts, analyses=["heads", "gates", "diversity",
                                      {"analysis": "composition", "args": {"n_baseline": 4}}])
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    assert cli_main(["sweep", str(path), "--out", str(tmp_path / "run"), "--no-png",
                     "--no-progress"]) == 0
    assert "16 shards (16 run, 0 already done)" in capsys.readouterr().out
    merged = pd.read_parquet(tmp_path / "run" / "merged.parquet")
    assert set(merged["kind"]) == {"heads", "gates", "diversity", "composition"}
    weights = merged[merged["kind"].isin(["diversity", "composition"])]
    assert (weights["shard"] == -1).all() and (weights["prompt_set"] == "").all()
    html = sorted(p.name for p in (tmp_path / "run" / "figures").glob("*.html"))
    assert "composition.html" in html and "diversity.html" in html
    assert "heads_rep_induction_pattern.html" in html and "gates_rep_mean.html" in html
    assert (tmp_path / "run" / "summary.parquet").is_file()
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(base_spec(ckpts, shard_size="4")))
    with pytest.raises(SystemExit, match="shard_size"):
        cli_main(["sweep", str(bad), "--out", str(tmp_path / "x"), "--no-progress"])


def test_errors_inside_a_shard_name_the_shard(ckpts, tmp_path):
    spec = base_spec(ckpts, analyses=[{"analysis": "heads", "args": {"stage": "nosuch"}}])
    with pytest.raises(ValueError, match=r"sweep shard mha/heads/rep\[0:3\].*nosuch"):
        run_sweep(spec, out=tmp_path, progress=False)
    long = base_spec(ckpts)
    long["prompts"][0]["args"]["half_len"] = 40       # 81 tokens > n_ctx 32
    with pytest.raises(ValueError, match="n_ctx"):
        run_sweep(long, out=tmp_path / "b", progress=False)
    with pytest.raises(ValueError, match="no output folder"):
        run_sweep(base_spec(ckpts), progress=False)


@pytest.mark.parametrize("shard_size", [2, 7])
def test_circuit_edge_scores_merge_exactly_across_shards(ckpts, tmp_path, shard_size):
    """The `circuit` analysis: a shard's edge scores are the mean (and sum) over its prompts,
    so the prompt-weighted mean over shards equals EAP-IG on all 7 prompts at once."""
    from attnlens.interp.circuits.discovery.prompt_scores import prompt_edge_scores

    spec = base_spec(ckpts, shard_size=shard_size,
                     analyses=[{"analysis": "circuit", "args": {"steps": 3}}])
    result = run_sweep(spec, out=tmp_path, progress=False, png=False)
    tokens = repeated_tokens(7, HALF, 50, seed=3)
    merged = result.of("circuit")
    assert merged["shard"].nunique() == -(-7 // shard_size)
    summary = result.of("circuit", summary=True)
    for name in ("mha", "mta"):
        want = prompt_edge_scores(model_of(ckpts / name), tokens, steps=3).set_index("edge")
        got = summary[summary["model"] == name].set_index("edge").loc[want.index]
        assert (got["n_prompts"] == 7).all() and len(want) > 10
        assert (got["edge_kind"] == want["edge_kind"]).all()
        for col in ("score", "metric_clean", "metric_corrupted"):
            torch.testing.assert_close(torch.tensor(got[col].to_numpy(float)),
                                       torch.tensor(want[col].to_numpy(float)), **EXACT)
        torch.testing.assert_close(torch.tensor(got["score_sum"].to_numpy(float)),
                                   torch.tensor(7 * want["score"].to_numpy(float)), **EXACT)
    assert any(p.name.startswith("circuit") for p in result.figures)
